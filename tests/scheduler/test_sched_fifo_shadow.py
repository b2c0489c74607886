"""The FIFO shadow (``scheduler/fifo_shadow``): its finish times are those of the ``fifo``
policy run in the simulator (exact timings), by hand on small cases, and list scheduling on
several replicas; conservation; the nondecreasing flow budget."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_factories import PAGE, req, table_cost

from ditmem.scheduler import make_policy
from ditmem.scheduler.fifo_shadow import FifoShadow, FlowBound
from ditmem.scheduler.simulator import simulate


def test_one_replica_by_hand():
    shadow = FifoShadow()
    assert shadow.add("a", 0.0, 5.0).finish == 5.0
    assert shadow.add("b", 1.0, 2.0).finish == 7.0  # waits for a
    assert shadow.add("c", 10.0, 1.0).finish == 11.0  # idle gap
    assert shadow.entry("b").flow == 6.0
    assert shadow.backlog(10.5) == pytest.approx(0.5)
    shadow.forget("a")
    assert "a" not in shadow and len(shadow) == 2


def test_two_replicas_by_hand():
    shadow = FifoShadow(replicas=2)
    assert shadow.add("a", 0.0, 5.0).finish == 5.0
    assert shadow.add("b", 0.0, 3.0).finish == 3.0  # the idle second replica
    assert shadow.add("c", 1.0, 4.0).finish == 7.0  # behind b (free at 3)
    assert shadow.add("d", 2.0, 1.0).finish == 6.0  # behind a (free at 5)
    assert shadow.backlog(2.0) == pytest.approx((7 - 2) + (6 - 2))


def test_bad_input_is_refused():
    shadow = FifoShadow()
    shadow.add("a", 5.0, 1.0)
    with pytest.raises(ValueError, match="arrival"):
        shadow.add("b", 4.0, 1.0)
    with pytest.raises(ValueError, match="already"):
        shadow.add("a", 6.0, 1.0)
    with pytest.raises(ValueError, match="work"):
        shadow.add("c", 6.0, -1.0)
    with pytest.raises(ValueError, match="replicas"):
        FifoShadow(0)
    with pytest.raises(ValueError, match="quantile"):
        FlowBound(0.0)


def test_the_shadow_is_the_fifo_policy_of_the_simulator():
    """Independent reference: the simulator running ``fifo`` (exact timings, no transfers)."""
    cost = table_cost(link=1e15, encode_s=0.3, decode_s_per_mp=2.0)
    rng = random.Random(3)
    trace, t = [], 0.0
    for i in range(150):
        t += rng.expovariate(1 / 3.0)
        trace.append(req(f"r{i:03d}", t, size=rng.choice((512, 1024)),
                         steps=rng.randint(1, 6), cost=cost))
    res = simulate(trace, make_policy("fifo", cost), page_bytes=PAGE, device_pages=64)
    shadow = FifoShadow()
    for r in sorted(trace, key=lambda r: r.arrival):
        shadow.add(r.id, r.arrival, cost.standalone_time(r))
    for rec in res.records:
        assert rec.finished == pytest.approx(shadow.entry(rec.request.id).finish, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 20), st.floats(0, 10)), min_size=1, max_size=30),
       st.integers(1, 3))
def test_conservation_and_list_scheduling(jobs, replicas):
    """Each finish is arrival + wait + work, the wait is what list scheduling gives (the
    earliest a replica frees, by a brute-force replay), and on one replica the backlog just
    before an arrival plus its work is its flow time."""
    jobs = sorted(jobs)
    shadow = FifoShadow(replicas)
    free = [0.0] * replicas
    for n, (arrival, work) in enumerate(jobs):
        backlog = shadow.backlog(arrival)
        entry = shadow.add(str(n), arrival, work)
        k = min(range(replicas), key=lambda j: free[j])
        expect = max(arrival, free[k]) + work
        free[k] = expect
        assert entry.finish == pytest.approx(expect)
        if replicas == 1:
            assert entry.flow == pytest.approx(backlog + work)


def test_flow_bound_is_a_running_quantile_never_lowered():
    bound = FlowBound(1.0)
    assert [bound.see(x) for x in (3.0, 1.0, 5.0, 2.0)] == [3.0, 3.0, 5.0, 5.0]
    q = FlowBound(0.5, memory=4)
    seen = [q.see(x) for x in (4.0, 1.0, 1.0, 1.0, 1.0, 9.0)]
    # median of the window, but never below what it was: 4, 1->4 (kept), ...
    assert seen == [4.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    q2 = FlowBound(0.75)
    flows = [float(x) for x in range(1, 101)]
    for x in flows:
        q2.see(x)
    assert q2.value == 75.0
