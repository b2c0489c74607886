"""Block-level preemption in the simulator: hand-computed schedules, the chunk-size rule,
async offload overlap, restore before resume, equivalence with step mode, CLI fields."""

import json

import pytest
from sched_factories import req, table_profile

from ditmem.scheduler import CostModel, Request, StepPlan, make_policy
from ditmem.scheduler.chunking import choose_chunk
from ditmem.scheduler.cli import add_arguments, main
from ditmem.scheduler.policies import Policy
from ditmem.scheduler.simulator import PlanError, simulate
from ditmem.scheduler.workloads import workload

BLOCKS = 10


def block_cost(*, overhead=0.0, act_bytes=1e8, link=1e9, **kw) -> CostModel:
    """512² (1,024 tokens) steps in 1 s, 1024² (4,096 tokens) in 10 s; 10 blocks a step;
    a 1024² step parks ``act_bytes`` of activations; the host link moves ``link`` B/s."""
    prof = table_profile(seconds_1024=1.0, seconds_4096=10.0, link=link, **kw)
    prof["chunk_overhead_s"] = {"value": overhead, "source": "test"}
    model = prof["models"]["qwen-image"]
    model["blocks"] = {"value": BLOCKS, "source": "test"}
    model["activation_bytes_per_token"] = {"value": act_bytes / 4096, "source": "test"}
    return CostModel.from_dict(prof)


def long_and_urgent(cost, *, urgent_slo_ms=None, at=0.5):
    long = req("long", 0.0, size=1024, steps=1, priority=2, cost=cost)
    urgent = req("urgent", at, size=512, steps=1, priority=0, slo_ms=urgent_slo_ms, cost=cost)
    return [long, urgent]


def finish(res) -> dict[str, float]:
    return {r.request.id: r.finished for r in res.records}


def test_step_mode_urgent_waits_for_the_whole_step():
    cost = block_cost()
    res = simulate(long_and_urgent(cost), make_policy("srtf", cost))
    assert finish(res) == pytest.approx({"long": 10.0, "urgent": 11.0})
    urgent = next(r for r in res.records if r.request.id == "urgent")
    assert urgent.started - urgent.request.arrival == pytest.approx(9.5)  # ≤ one step


def test_block_mode_urgent_waits_at_most_one_chunk_and_restore_delays_the_resume():
    # k = 2 blocks (2 s chunks), 0.01 s per preemption point inside a step.
    cost = block_cost(overhead=0.01)
    pol = make_policy("srtf", cost)
    pol.fixed_chunk = 2
    res = simulate(long_and_urgent(cost), pol, preemption="block")
    urgent = next(r for r in res.records if r.request.id == "urgent")
    # long: blocks 0-2 until 2.0, + point 0.01; urgent's 1 s step runs 2.01 → 3.05 (5 chunks
    # of 0.2 s, 4 inner points); long's offload (0.1 s) ran 2.01 → 2.11, overlapped with it;
    # restore 0.1 s: 3.05 → 3.15; then 8 blocks (8 s) and 3 more inner points: 11.18.
    assert urgent.started - urgent.request.arrival == pytest.approx(1.51)  # ≤ one chunk
    assert finish(res) == pytest.approx({"long": 11.18, "urgent": 3.05})
    assert res.parks == 1 and res.chunks == 10
    assert res.link_busy_s == pytest.approx(0.2)


def test_resume_before_the_offload_finished_needs_no_restore():
    # 3 GB at 1 GB/s: the offload is still in flight when long resumes at 3.0.
    cost = block_cost(act_bytes=3e9)
    pol = make_policy("srtf", cost)
    pol.fixed_chunk = 2
    res = simulate(long_and_urgent(cost), pol, preemption="block")
    # urgent: 2.0 → 3.0 in 5 chunks; long resumes at 3.0 from its device pages: 3.0 + 8 s.
    assert finish(res) == pytest.approx({"long": 11.0, "urgent": 3.0})


def test_chunk_of_all_blocks_is_exactly_step_mode():
    cost = CostModel.load("h200")
    reqs = workload("seed-mix", cost, requests=120, seed=2, load=0.9)
    step = simulate(reqs, make_policy("slo", cost))
    pol = make_policy("slo", cost)
    pol.fixed_chunk = 60
    block = simulate(reqs, pol, preemption="block")
    assert [(r.request.id, r.finished) for r in block.records] == [
        (r.request.id, r.finished) for r in step.records
    ]
    assert block.parks == 0


def test_slo_parks_a_long_step_only_when_the_arrivals_slack_needs_it():
    cost = block_cost()
    # Urgent with 3 s of SLO: waiting for the step (until 10 s) would miss; it is parked.
    tight = simulate(long_and_urgent(cost, urgent_slo_ms=3000), _slo(cost), preemption="block")
    assert tight.parks == 1
    assert finish(tight)["urgent"] <= 0.5 + 3.0
    # Urgent with 30 s of SLO: finishing the step first keeps it on time; no park.
    loose = simulate(long_and_urgent(cost, urgent_slo_ms=30000), _slo(cost), preemption="block")
    assert loose.parks == 0
    assert finish(loose) == pytest.approx({"long": 10.0, "urgent": 11.0})


def _slo(cost):
    pol = make_policy("slo", cost, forecast="off")
    pol.fixed_chunk = 2
    return pol


def test_choose_chunk_from_the_cost_model():
    cost = CostModel.load("h200")
    video = Request("v", 0.0, "wan2.2-ti2v-5b", 1280, 704, 121, 50)
    image = Request("i", 0.0, "wan2.2-ti2v-5b", 1024, 1024, 1, 50)
    wan720 = Request("w", 0.0, "wan2.2-a14b", 1280, 720, 81, 40)
    # 5B 720p: 2.088 s / 30 blocks = 69.6 ms a block; 2 ms point / (1 % × 69.6 ms) → 3.
    assert choose_chunk(cost, [video]) == 3
    # an image step (57 ms for 30 blocks) is not worth splitting
    assert choose_chunk(cost, [image]) == 30
    # 14B 720p: 655 ms a block: every block is a preemption point
    assert choose_chunk(cost, [wan720]) == 1
    # Wan 720p activations: 75,600 tokens × 5120 × bf16 ≈ 0.77 GB per CFG branch (×2)
    assert cost.activation_bytes(wan720) == 2 * 75_600 * 5120 * 2
    assert cost.blocks("qwen-image") == 60 and cost.blocks("wan2.2-a14b") == 40


class _MixPartDone(Policy):
    name = "bad"
    fixed_chunk = 2

    def schedule(self, now, view):
        if not view.active:
            r = view.waiting.first("arrival")
            return StepPlan(batch=[r.id], admit=[r.id])
        ids = [s.id for s in view.active]
        waiting = [r.id for r in view.waiting.iter_by("arrival", 10)]
        return StepPlan(batch=ids + waiting, admit=waiting)


def test_a_part_done_step_cannot_take_joiners():
    cost = block_cost()
    with pytest.raises(PlanError, match="part-done step"):
        simulate(long_and_urgent(cost, at=1.0), _MixPartDone(cost), preemption="block")


def test_block_mode_is_deterministic():
    cost = CostModel.load("h200")
    runs = []
    for _ in range(2):
        reqs = workload("video-image-mix", cost, requests=150, seed=5, load=0.8, slo_scale=1.3)
        res = simulate(reqs, make_policy("slo", cost), slo_scale=1.3, preemption="block")
        runs.append([(r.request.id, r.finished, r.parks) for r in res.records])
    assert runs[0] == runs[1]
    assert any(p for _, _, p in runs[0])  # tight SLOs do park video steps


def test_cli_block_preemption_json_fields(tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "o.json"
    args = parser.parse_args(
        "--workload video-image-mix --policy slo --requests 60 --quiet --preemption block "
        f"--block-chunk 5 --json {out}".split()
    )
    assert main(args) == 0
    row = json.loads(out.read_text())[0]
    assert row["preemption"] == "block" and row["block_chunk"] == 5
    assert row["chunks"] > 0 and "parks" in row and row["link_busy_s"] >= 0
    assert set(row["per_priority"]["0"]) >= {"wait_p99_s", "wait_max_s", "p99_s"}
    bad = parser.parse_args("--workload seed-mix --block-chunk 3 --quiet".split())
    assert main(bad) == 2
    assert "--block-chunk needs --preemption block" in capsys.readouterr().err


def test_slo_splits_steps_only_as_finely_as_recent_arrivals_need():
    cost = CostModel.load("h200")
    video = Request("v", 0.0, "wan2.2-ti2v-5b", 1280, 704, 121, 50)
    pol = make_policy("slo", cost)
    assert pol.chunk_blocks([video]) == 3  # no arrivals seen yet: the cost model's least k

    def seen(slo_ms):
        r = Request("i", 1.0, "wan2.2-ti2v-5b", 1024, 1024, 1, 50, slo_ms=slo_ms)
        cost.assign_deadline(r)
        p = make_policy("slo", cost)
        p.forecast.see([r])
        return p, r.deadline - r.arrival - r.standalone_s

    # an image that can wait 60 s: a 2.09 s step need not be split at all
    p, slack = seen(63_000)
    assert p.chunk_blocks([video]) == 30
    # 1 s of slack: chunks of ⌊0.25 × slack / 69.6 ms⌋ blocks
    p, slack = seen(3_980)
    block_s = cost.step_time("wan2.2-ti2v-5b", [cost.tokens(video)]) / 30
    assert p.chunk_blocks([video]) == max(3, int(0.25 * slack / block_s))
    # no slack at all: the least chunk the overhead budget allows
    p, _ = seen(1_000)
    assert p.chunk_blocks([video]) == 3
