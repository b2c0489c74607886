"""benchmarks/scheduler/tail_flows.py: when slo gave a request up, with how many steps left,
and when its last step ended, read from a decision log."""

import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tail_flows(load_benchmark):
    return load_benchmark("scheduler/tail_flows.py")


def test_what_slo_did_on_a_hand_schedule(tail_flows):
    """The schedule of ``test_sched_late_order``'s late-share decode case (default slo, 512²: 1 s a
    step, decode 4 tiles of 0.5 s): L1 (2 steps, due 1) is given up at its arrival, 0,
    before any step; L2 (6 steps, due 1.5, arrives 0.5) at the decision at 1, with all 6
    left. L1's steps run 0–2 and, as a tail-lane member, its decode whole 2–4 (session 18;
    before, one late tile at 7 and the rest after L2's steps); L2's steps 4–10; a request
    never held late reads None."""
    from ditmem.scheduler import CostModel, make_policy
    from ditmem.scheduler.policies.recorder import DecisionLog
    from ditmem.scheduler.simulator import simulate

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))
    from sched_factories import req, table_profile

    data = table_profile(decode_s_per_mp=1.0)
    data["models"]["qwen-image"].update(
        decode_tile_px={"value": 256, "source": "test"},
        decode_stride_px={"value": 256, "source": "test"},
        decode_tile_s={"value": 0.5, "source": "test"},
    )
    cost = CostModel.from_dict(data)
    trace = [req("L1", 0.0, steps=2, slo_ms=1_000, cost=cost),
             req("L2", 0.5, steps=6, slo_ms=1_000, cost=cost)]
    pol = DecisionLog(make_policy("slo", cost, forecast="off"))
    simulate(trace, pol, decode="tiled")
    assert tail_flows.what_slo_did(pol.log, "L1") == (0.0, 0, pytest.approx(2.0))
    assert tail_flows.what_slo_did(pol.log, "L2") == (1.0, 0, pytest.approx(10.0))
    assert tail_flows.what_slo_did(pol.log, "nobody") == (None, 0, None)
