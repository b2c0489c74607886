"""The node demo's target checks and trace limits (pure, on hand-made numbers)."""

import pytest

from ditmem.tools.node_demo import targets


def _row(att, p95, p99):
    return {"slo_attainment": att, "p95_s": p95, "p99_s": p99}


def test_targets_use_the_bound_and_the_floor_where_they_are_the_honest_bar():
    fifo = _row(0.60, 40.0, 60.0)
    # bound 100 %: the bar is 99 %; floor 10 s: 1.2 x floor = 12 < 0.5 x fifo = 20
    met = targets({"fifo": fifo, "slo": _row(0.992, 19.0, 55.0)},
                  {"bound_attainment": 1.0, "p95_floor_s": 10.0})
    assert [ok for _, ok, _ in met] == [True, True, True]
    # bound 95 %: 94.6 % is within half a point; floor 30 s: bar 36 s, not 20 s
    met = targets({"fifo": fifo, "slo": _row(0.946, 35.0, 61.0)},
                  {"bound_attainment": 0.95, "p95_floor_s": 30.0})
    assert [ok for _, ok, _ in met] == [True, True, False]
    missed = targets({"fifo": fifo, "slo": _row(0.98, 21.0, 59.0)},
                     {"bound_attainment": 1.0, "p95_floor_s": 10.0})
    assert [ok for _, ok, _ in missed] == [False, False, True]


def test_a_saved_demo_profile_is_used_as_is(tmp_path):
    import json
    from argparse import Namespace
    from pathlib import Path

    from ditmem.scheduler.cost import CostModel
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.tools.node_demo import _profile

    path = Path(__file__).parents[2] / "benchmarks/parallel/results/demo_devices2_run2_profile.json"
    saved = json.loads(path.read_text())
    saved["links"]["job_latency_s"] = 0.0007  # a profile measured since job latencies exist
    given = tmp_path / "profile.json"
    given.write_text(json.dumps(saved))
    args = Namespace(profile=str(given), workload="seed-mix", divisor=2)
    profile = _profile(args, None, lambda *_: None)  # no node needed: nothing is measured
    assert profile == saved
    assert NodeCost(CostModel.from_dict(profile)).speedup("qwen-image", 4096, 2) > 1.5


def test_a_saved_demo_profile_without_job_latency_gets_it_measured(monkeypatch):
    """The one thing measured for a saved profile: ``links.job_latency_s`` when it lacks it
    (``ditmem.parallel.job_latency.add_job_latency`` on the node, here a stand-in)."""
    import json
    from argparse import Namespace
    from pathlib import Path

    from ditmem.parallel import job_latency
    from ditmem.tools.node_demo import _profile

    path = Path(__file__).parents[2] / "benchmarks/parallel/results/demo_devices2_run2_profile.json"
    saved = json.loads(path.read_text())
    assert "job_latency_s" not in saved["links"]
    calls = []

    def measured(node, links, log=None, repeats=9):
        calls.append(node)
        links["job_latency_s"] = 0.0009
        log("job latency: 0.90 ms per job")
        return {"job_latency_s": 0.0009}

    monkeypatch.setattr(job_latency, "add_job_latency", measured)
    lines: list[str] = []
    profile = _profile(Namespace(profile=str(path), workload="seed-mix", divisor=2), "node",
                       lines.append)
    assert calls == ["node"]
    assert profile["links"]["job_latency_s"] == 0.0009
    saved["links"]["job_latency_s"] = 0.0009
    assert profile == saved
    assert "no job_latency_s: measuring it" in lines[0] and lines[1].startswith("job latency")


def test_tracked_devices_put_each_stage_beside_the_profile():
    """Measured stage times are summed per stage (steps per degree) beside the profile's
    prediction for the same jobs: 3 steps of a 4096-token request at degree 2 are predicted
    at 3 x (degree-1 step / speed-up 1.8)."""
    import json
    from pathlib import Path

    import ditmem.scheduler as sched
    from ditmem.scheduler.cost import CostModel
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.scheduler.node.device import Completion, Job, Timings
    from ditmem.scheduler.node.topology import Node
    from ditmem.scheduler.request import Request
    from ditmem.tools.node_demo import TrackedDevices

    data = json.loads((Path(sched.__file__).parent / "profiles" / "cpu-tiny.json").read_text())
    data["parallel"] = {"qwen-image": {"tokens": [16, 4096], "source": "test",
                                       "speedup": {"1": [1.0, 1.0], "2": [1.2, 1.8]}}}
    data["links"] = {"device_bytes_per_s": 1e9, "host_bytes_per_s": 5e9, "source": "test"}
    truth = NodeCost(CostModel.from_dict(data))
    one = truth.cost.step_time("qwen-image", [4096])  # the single-device profile's step
    pair, single = Node(2, truth.links).groups(2)[0], Node(2, truth.links).groups(1)[0]
    big = Request("big", 0.0, "qwen-image", width=1024, height=1024, steps=28)
    assert truth.cost.tokens(big) == 4096

    class Inner:
        def __init__(self):
            self.done = []

        def launch(self, job, now):
            self.done.append(Completion(job, now, now + 1, Timings(step_s=job.steps * one)))

        def wait(self, until):
            done, self.done = self.done, []
            return done

    tracked = TrackedDevices(Inner(), truth)
    tracked.launch(Job(0, pair, [big], 3), 0.0)
    tracked.launch(Job(1, single, [big], 2), 0.0)
    assert len(tracked.wait(None)) == 2
    out = tracked.summary()
    assert set(out) == {"steps d1", "steps d2"}
    assert out["steps d2"]["predicted_s"] == pytest.approx(3 * one / 1.8)
    assert out["steps d2"]["ratio"] == pytest.approx(1.8)   # ran at degree-1 speed
    assert out["steps d1"]["ratio"] == pytest.approx(1.0)
    assert out["steps d1"]["jobs"] == 1
    rows = tracked.job_timings()
    assert rows["columns"] == ["stage", "class", "count", "measured_s", "predicted_s",
                               "job_started_s", "job_finished_s"]
    assert rows["rows"] == [["steps d2", "1024x1024", 3, pytest.approx(3 * one),
                             pytest.approx(3 * one / 1.8), 0.0, 1.0],
                            ["steps d1", "1024x1024", 2, pytest.approx(2 * one),
                             pytest.approx(2 * one), 0.0, 1.0]]


def test_workers_degree_one_step_is_checked_against_the_single_device_profile():
    """Before the parallel section exists: the workers' degree-1 steps (wall) beside the
    profile's single-device step for the same tokens; beyond x1.25 either way, called out."""
    import json
    from pathlib import Path

    from ditmem.scheduler.cost import CostModel
    from ditmem.tools.node_demo import check_against_profile

    path = Path(__file__).parents[2] / "benchmarks/parallel/results/demo_devices2_run4_profile.json"
    profile = json.loads(path.read_text())
    del profile["parallel"], profile["links"]
    one = 1000 * CostModel.from_dict(profile).step_time("qwen-image", [4096])
    rows = [{"degree": 1, "tokens": 4096, "step_ms": 1.1 * one},
            {"degree": 2, "tokens": 4096, "step_ms": 0.1 * one},  # not a degree-1 row
            {"degree": 1, "tokens": 256, "step_ms": 1000.0}]
    lines = []
    off = check_against_profile(rows, profile, "qwen-image", lines.append)
    assert len(lines) == 2 and "(x1.10)" in lines[0]
    assert off == [lines[1]] and "256 tokens" in off[0] and "machine changed" in off[0]


def test_the_proven_latency_bounds_are_never_beaten_by_the_simulated_policies():
    import json
    from argparse import Namespace
    from pathlib import Path

    from ditmem.scheduler.cost import CostModel
    from ditmem.tools.node_demo import build_trace, limits, predict

    path = Path(__file__).parents[2] / "benchmarks/parallel/results/demo_devices2_run6_profile.json"
    cost = CostModel.from_dict(json.loads(path.read_text()))
    args = Namespace(workload="seed-mix", load=0.8, requests=60, seed=1, arrival="poisson",
                     divisor=2)
    trace = build_trace(args, cost, 2)
    lim = limits(trace, cost, 2)
    assert 0 < lim["p95_bound_s"] <= lim["p99_bound_s"]
    for name in ("fifo", "srtf", "elastic-np", "slo"):
        row = predict(name, trace, cost, 2, seed=1)
        # 3 % timing noise in the prediction: the bound is on profile times
        assert row["p95_s"] >= 0.9 * lim["p95_bound_s"], name
        assert row["p99_s"] >= 0.9 * lim["p99_bound_s"], name
