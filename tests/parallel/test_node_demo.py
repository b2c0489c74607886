"""The node demo's target checks and trace limits (pure, on hand-made numbers)."""

from ditmem.parallel.node_demo import targets


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


def test_a_saved_demo_profile_is_used_as_is():
    import json
    from argparse import Namespace
    from pathlib import Path

    from ditmem.parallel.node_demo import _profile
    from ditmem.scheduler.cost import CostModel
    from ditmem.scheduler.node.cost import NodeCost

    path = Path(__file__).parents[2] / "benchmarks/parallel/results/demo_devices2_run2_profile.json"
    args = Namespace(profile=str(path), workload="seed-mix", divisor=2)
    profile = _profile(args, None, lambda *_: None)  # no node needed: nothing is measured
    assert profile == json.loads(path.read_text())
    assert NodeCost(CostModel.from_dict(profile)).speedup("qwen-image", 4096, 2) > 1.5
