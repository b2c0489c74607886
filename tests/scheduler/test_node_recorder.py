"""``DecisionLog`` / ``time_split``: where a request's time went, hand-computed.

Profile (node_factories, as in test_node_sim_release): a 512² steps in 1 s; a 1024² in 4 s
at degree 1, 2 s at degree 2; decode 8 s per 1024², 2 s per 512²; noise off; the scripted
policy places each request on the group the test names as soon as it is free.
"""

import dataclasses

import pytest
from node_factories import by_id, node_cost
from sched_factories import req
from test_node_sim_release import DECODE, Script

from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.policies.recorder import DecisionLog, time_split
from ditmem.scheduler.node.simulator import simulate_node
from ditmem.scheduler.node.topology import Node
from ditmem.scheduler.noise import TimingNoise


def _large(r):
    return r.width >= 1024


def test_a_small_request_waits_for_a_large_ones_steps_then_its_decode_frees_a_device():
    """big (1024², 2 steps) at degree 2 from 0: steps 0-2 and 2-4, decode on device 0 4-12.
    small (512², 2 steps) arrives at 1 for device 1: waits 1-2 behind big's first step
    (large step) and 2-4 behind its last job (large decode), steps 4-5, last step 5-6 and
    decode 6-8. The states sum to each latency."""
    nc = node_cost(decode_s_per_mp=DECODE)
    reqs = [req("big", 0.0, size=1024, steps=2), req("small", 1.0, size=512, steps=2)]
    for r in reqs:
        nc.cost.assign_deadline(r, 3.0)
    node = Node(2, nc.links)
    log = DecisionLog(Script(nc, node, {"big": (2, 0), "small": (1, 1)}), _large)
    out = by_id(simulate_node(reqs, log, node, noise=TimingNoise(0.0)))
    assert out["big"].finished == pytest.approx(12.0)
    assert out["small"].finished == pytest.approx(8.0)
    split = time_split(log.log, out.values(), lambda r: True)
    assert split["big"] == pytest.approx({"step d=2": 2.0, "last step + decode": 10.0})
    assert split["small"] == pytest.approx({
        "wait (large step)": 1.0, "wait (large decode)": 2.0,
        "step d=1": 1.0, "last step + decode": 3.0})
    only = time_split(log.log, out.values(), lambda r: _large(r.request))
    assert list(only) == ["big"]
    # cut at 5 s (e.g. a deadline): small's wait and its first step only
    cut = time_split(log.log, out.values(), lambda r: r.request.id == "small", lambda r: 5.0)
    assert cut["small"] == pytest.approx({
        "wait (large step)": 1.0, "wait (large decode)": 2.0, "step d=1": 1.0})


def test_logging_changes_no_decision():
    """slo with and without the log: the same records, to the digit (noise on, seeded)."""
    nc = node_cost(decode_s_per_mp=DECODE)
    reqs = [req(f"r{i}", 0.7 * i, size=1024 if i % 3 == 0 else 512, steps=3)
            for i in range(12)]
    for r in reqs:
        nc.cost.assign_deadline(r, 3.0)

    def run(wrap):
        node = Node(2, nc.links)
        pol = make_node_policy("slo", node_cost(decode_s_per_mp=DECODE), node)
        pol = DecisionLog(pol, _large) if wrap else pol
        res = simulate_node([dataclasses.replace(r) for r in reqs], pol, node,
                            noise=TimingNoise(0.03, 0.0, 1))
        return [(r.request.id, r.started, r.finished, r.degrees) for r in res.records], pol

    plain, _ = run(False)
    logged, pol = run(True)
    assert logged == plain
    assert pol.log and all(d.now >= 0 for d in pol.log)


def test_the_log_hands_the_split_choice_to_its_policy():
    """The loop asks the policy per job whether to split its decodes (``split_decode``): the
    log must answer as the policy it wraps, not as the base class (off)."""
    nc = node_cost(decode_s_per_mp=DECODE)
    node = Node(2, nc.links)
    for split in (False, True):
        pol = make_node_policy("slo", nc, node, split_decodes=split)
        log = DecisionLog(pol, _large)
        assert log.split_decode(None, None, None) is pol.split_decode(None, None, None) is split
