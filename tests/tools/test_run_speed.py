"""The demos' references at the speed a run measured (ditmem.tools.run_speed), on fake runs:
a hand-made profile where a 64x64 request takes exactly 1 s alone (encode 0.1 + 100 steps
of 8 ms + decode 0.1), so every reference is computed by hand."""

from __future__ import annotations

import json

import pytest

from ditmem.scheduler import CostModel, Request
from ditmem.tools.run_speed import (
    as_run,
    describe,
    node_references,
    one_device_references,
    scale_profile,
    speed_factors,
)

SIDE_MPIX = 64 * 64 / 1e6


def _n(v):
    return {"value": v, "source": "test"}


def raw_profile(node: bool = False) -> dict:
    data = {
        "format": 1, "name": "hand", "description": "test",
        "device_bytes": _n(2e9), "host_bytes": _n(4e9), "host_link_bytes_per_s": _n(1e9),
        "page_bytes": _n(65536),
        "models": {"qwen-image": {
            "weights_bytes": _n(1000), "workspace_bytes": _n(1000),
            "state_bytes_per_token": _n(64.0), "state_bytes_per_request": _n(1000.0),
            "encode_s": _n(0.1), "decode_s_per_megapixel": _n(0.1 / SIDE_MPIX),
            "max_batch": _n(1),
            "step": {"kind": "table", "points": _n([
                {"tokens": 16, "batch": 1, "seconds": 0.008},
                {"tokens": 256, "batch": 1, "seconds": 0.05}])},
        }},
    }
    if node:
        data["parallel"] = {"qwen-image": {"tokens": [16, 256], "source": "test",
                                           "speedup": {"1": [1.0, 1.0], "2": [1.8, 1.9]}}}
        data["links"] = {"device_bytes_per_s": 1e9, "host_bytes_per_s": 5e8,
                         "move_latency_s": 0.002, "source": "test"}
    return data


def parsed(node: bool = False) -> dict:
    return CostModel.from_dict(raw_profile(node)).profile


def trace(n: int, budget_s: float) -> list[Request]:
    """``n`` 64x64 requests of 100 steps, all at t = 0, each due ``budget_s`` later."""
    cost = CostModel(parsed())
    return [cost.assign_deadline(Request(f"r{i}", 0.0, width=64, height=64, steps=100,
                                         slo_ms=1000 * budget_s)) for i in range(n)]


def test_the_hand_made_request_takes_one_second_alone():
    assert CostModel(parsed()).standalone_time(trace(1, 9)[0]) == pytest.approx(1.0)


def test_speed_factors_per_kind_and_the_overall_ratio_for_what_the_run_did_not_measure():
    summary = {"steps": {"measured_s": 11.0, "predicted_s": 10.0, "ratio": 1.1, "jobs": 5},
               "encodes": {"measured_s": 2.0, "predicted_s": 1.0, "ratio": 2.0, "jobs": 5}}
    f = speed_factors(summary)
    overall = 13.0 / 11.0
    assert f == pytest.approx({"steps": 1.1, "encodes": 2.0, "decodes": overall,
                               "moves": overall})
    node = speed_factors({"steps d1": {"measured_s": 1.2, "predicted_s": 1.0, "ratio": 1.2,
                                       "jobs": 1}}, degrees=(1, 2))
    assert node == pytest.approx({"steps d1": 1.2, "steps d2": 1.2, "encodes": 1.2,
                                  "decodes": 1.2, "moves": 1.2})
    assert speed_factors({}) == dict.fromkeys(("encodes", "decodes", "moves", "steps"), 1.0)


def test_scale_profile_scales_each_kind_by_its_own_factor_and_leaves_the_original():
    start = parsed(node=True)
    before = json.dumps(start, sort_keys=True)
    out = scale_profile(start, {"steps d1": 1.5, "steps d2": 1.8, "encodes": 2.0,
                                "decodes": 0.5, "moves": 4.0})
    assert json.dumps(start, sort_keys=True) == before
    m = out["models"]["qwen-image"]
    assert [p["seconds"] for p in m["step"]["points"]] == pytest.approx([0.012, 0.075])
    assert m["encode_s"] == pytest.approx(0.2)
    assert m["decode_s_per_megapixel"] * SIDE_MPIX == pytest.approx(0.05)
    assert out["host_link_bytes_per_s"] == pytest.approx(2.5e8)
    # degree-2 steps ran x1.8 where degree-1 ran x1.5: the speed-up is 1.5 / 1.8 of the
    # profile's (1.8 -> 1.5, 1.9 -> 1.583)
    assert out["parallel"]["qwen-image"]["speedup"]["2"] == pytest.approx([1.5, 1.9 * 1.5 / 1.8])
    assert out["parallel"]["qwen-image"]["speedup"]["1"] == [1.0, 1.0]
    assert out["links"]["device_bytes_per_s"] == pytest.approx(2.5e8)
    assert out["links"]["host_bytes_per_s"] == pytest.approx(1.25e8)
    assert out["links"]["move_latency_s"] == pytest.approx(0.008)
    # a speed-up may not exceed its degree: degree 2 much faster than degree 1 is capped
    fast = scale_profile(start, {"steps d1": 2.0, "steps d2": 0.5})
    assert fast["parallel"]["qwen-image"]["speedup"]["2"] == [2.0, 2.0]
    with pytest.raises(ValueError, match="encodes"):
        scale_profile(start, {"encodes": 0.0})
    with pytest.raises(ValueError, match="steps"):
        scale_profile(start, {"steps": float("nan")})


def test_a_flops_step_model_scales_as_a_whole():
    cost = CostModel.load("h200")
    slow = CostModel(scale_profile(cost.profile, {"steps": 1.25}))
    for tokens in ([1024], [4096], [4096, 1024]):
        assert slow.step_time("qwen-image", tokens) == pytest.approx(
            1.25 * cost.step_time("qwen-image", tokens))


def test_as_run_keeps_arrivals_and_deadlines_and_prices_the_run():
    t = trace(2, 3.5)
    run = CostModel(scale_profile(parsed(), {"steps": 2.0, "encodes": 1.0, "decodes": 3.0}))
    out = as_run(t, run)
    assert [(r.arrival, r.deadline) for r in out] == [(r.arrival, r.deadline) for r in t]
    # 0.1 encode + 100 x 16 ms + 3 x 0.1 decode
    assert [r.standalone_s for r in out] == pytest.approx([2.0, 2.0])
    assert [r.standalone_s for r in t] == pytest.approx([1.0, 1.0])


@pytest.mark.parametrize(("factors", "clairvoyant"), [
    # three 1-s requests at t = 0, due at 3.5 s: one after the other they end at 1, 2, 3 s
    ({"steps": 1.0, "encodes": 1.0, "decodes": 1.0}, 3 / 3),
    # all x1.5: they end at 1.5, 3.0, 4.5 s -> one misses
    ({"steps": 1.5, "encodes": 1.5, "decodes": 1.5}, 2 / 3),
    # steps x2 (1.8 s each): 1.8, 3.6 -> two miss (give-up keeps only one)
    ({"steps": 2.0, "encodes": 1.0, "decodes": 1.0}, 1 / 3),
    # encodes x2 (1.1 s each): 1.1, 2.2, 3.3 -> all meet
    ({"steps": 1.0, "encodes": 2.0, "decodes": 1.0}, 3 / 3),
    # decodes x6 (1.5 s each): as all x1.5
    ({"steps": 1.0, "encodes": 1.0, "decodes": 6.0}, 2 / 3),
])
def test_one_device_references_at_run_speed_are_the_hand_computed_ones(factors, clairvoyant):
    ref = one_device_references(trace(3, 3.5), parsed(), dict(factors, moves=1.0), "fifo",
                                65536, 4096, "inline")
    assert ref["clairvoyant_attainment"] == pytest.approx(clairvoyant)
    assert ref["bound_attainment"] >= ref["clairvoyant_attainment"]
    # fifo in the simulator runs them one after the other, as the clairvoyant order does
    # (3 % noise cannot move 3.0 s past 3.5 s or 4.5 s before it)
    assert ref["sim_slo_attainment"] == pytest.approx(clairvoyant)
    assert ref["factors"]["steps"] == factors["steps"]


def test_at_the_profile_speed_they_equal_the_demo_start_up_references(tmp_path):
    from ditmem.tools.demo import predict, trace_limits

    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw_profile()))
    t = trace(3, 2.5)  # the third ends at 3 s: a miss at start-up already
    start = trace_limits(t, CostModel.load(path))
    sim = predict(t, "slo", str(path), 65536, 4096)
    ref = one_device_references(t, parsed(), speed_factors({}), "slo", 65536, 4096, "inline")
    assert ref["clairvoyant_attainment"] == start["clairvoyant_attainment"] == pytest.approx(2 / 3)
    assert ref["bound_attainment"] == start["bound_attainment"]
    assert ref["sim_slo_attainment"] == sim["slo_attainment"]
    assert ref["sim_p95_s"] == sim["p95_s"]


def test_node_references_at_run_speed_are_the_hand_computed_ones():
    # six 1-s requests at t = 0 due at 2.2 s on two devices; the clairvoyant reference runs
    # them on one 2x-faster machine: 0.5 s each -> 4 end by 2.0 s, the others miss
    t = trace(6, 2.2)
    start = node_references(t, parsed(node=True), dict.fromkeys(
        ("steps d1", "steps d2", "encodes", "decodes", "moves"), 1.0), "fifo", 2, 0)
    assert start["clairvoyant_attainment"] == pytest.approx(4 / 6)
    # alone at degree 2: 0.1 + 100 x 8 ms / 1.8 + 0.1
    assert start["p95_floor_s"] == pytest.approx(0.2 + 0.8 / 1.8)
    slow = node_references(t, parsed(node=True), {"steps d1": 1.2, "steps d2": 1.2,
                                                  "encodes": 1.2, "decodes": 1.2,
                                                  "moves": 1.0}, "fifo", 2, 0)
    # x1.2: 0.6 s each on the 2x machine -> 3 end by 1.8 s, the 4th at 2.4 s misses
    assert slow["clairvoyant_attainment"] == pytest.approx(3 / 6)
    assert slow["p95_floor_s"] == pytest.approx(1.2 * (0.2 + 0.8 / 1.8))
    assert slow["bound_attainment"] >= slow["clairvoyant_attainment"]
    # fifo on two replicas: pairs end at 1, 2, 3 s (4 meet) / 1.2, 2.4, 3.6 s (2 meet)
    assert start["sim_slo_attainment"] == pytest.approx(4 / 6)
    assert slow["sim_slo_attainment"] == pytest.approx(2 / 6)


def test_node_references_at_the_profile_speed_equal_the_node_demo_start_up_ones():
    from ditmem.tools.node_demo import limits, predict

    t = trace(6, 2.2)
    cost = CostModel(parsed(node=True))
    ref = node_references(t, cost.profile, speed_factors({}, (1, 2)), "slo", 2, 0)
    lim, sim = limits(t, cost, 2), predict("slo", t, cost, 2, 0)
    for k in ("bound_attainment", "clairvoyant_attainment", "p95_floor_s"):
        assert ref[k] == lim[k]
    assert ref["sim_slo_attainment"] == sim["slo_attainment"]
    assert ref["sim_p95_s"] == sim["p95_s"]


def test_describe_prints_both_references_labelled():
    start = {"bound_attainment": 1.0, "clairvoyant_attainment": 0.987,
             "sim_slo_attainment": 0.973, "sim_p95_s": 15.5}
    at_run = {"factors": {"steps": 1.12, "encodes": 1.4}, "bound_attainment": 1.0,
              "clairvoyant_attainment": 0.96, "sim_slo_attainment": 0.94, "sim_p95_s": 20.1}
    lines = describe("slo", start, at_run, {"slo_attainment": 0.88, "p95_s": 20.25})
    assert lines[0] == "  slo    speed measured in the run: encodes x1.40, steps x1.12"
    assert lines[2] == ("  slo    clairvoyant      start-up profile  98.7 %   at run speed  "
                        "96.0 %   (run:  88.0 %)")
    assert "15.50 s" in lines[4] and "20.10 s" in lines[4] and "20.25 s" in lines[4]


def test_job_gap_is_the_median_span_beyond_the_stages():
    """Three jobs: spans 10 ms, 12 ms and 1.0 s beside stages 8 ms, 9 ms and 0.2 + 0.79 s
    (a last step with its decode): gaps 2, 3 and 10 ms."""
    from ditmem.tools.run_speed import job_gap, job_spans

    rows = [["steps d1", "256x256", 1, 0.008, 0.007, 0.0, 0.010],
            ["steps d1", "256x256", 1, 0.009, 0.007, 0.02, 0.032],
            ["steps d1", "256x256", 1, 0.2, 0.2, 1.0, 2.0],
            ["decodes", "256x256", 1, 0.79, 0.8, 1.0, 2.0]]
    run = {"policy": "slo", "job_timings": {"rows": rows}}
    spans = job_spans(run)
    assert [k for k, _, _ in spans] == ["steps d1 256x256"] * 2 + ["steps d1 256x256 +dec"]
    assert [s for _, s, _ in spans] == pytest.approx([0.010, 0.012, 1.0])
    assert job_gap(run) == pytest.approx(0.003)
    assert job_gap(run, "mean") == pytest.approx(0.005)
    with pytest.raises(ValueError, match="statistic"):
        job_gap(run, "p95")
    with pytest.raises(ValueError, match="timestamps"):
        job_gap({"policy": "slo", "job_timings": {"rows": [r[:5] for r in rows]}})


def test_node_replay_pays_the_given_job_latency():
    """fifo on two replicas, six 1-s requests due at 2.2 s, one job each: pairs end at 1, 2,
    3 s (4 meet); with 0.5 s per job at 1.5, 3.0, 4.5 s (2 meet)."""
    from ditmem.scheduler.metrics import summarize
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.tools.run_speed import node_replay

    t, profile = trace(6, 2.2), parsed(node=True)
    run = NodeCost(CostModel(profile))
    att = [summarize(node_replay(t, profile, run, "fifo", 2, 0, job_latency_s=lat)[0].records
                     )["slo_attainment"] for lat in (None, 0.5)]
    assert att == pytest.approx([4 / 6, 2 / 6])
    assert run.links.job_latency_s == 0.0  # the caller's truth is left as it was
    with pytest.raises(ValueError, match="job_latency_s"):
        node_replay(t, profile, run, "fifo", 2, 0, job_latency_s=-1.0)
