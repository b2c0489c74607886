"""slo's FIFO promise on a node (step 0 of scheduler/node/policies/slo.py): promises from the
FIFO shadow against the simulated fifo baseline, and the guard keeping them by hand."""

import pytest
from node_factories import node_cost
from sched_factories import req

from ditmem.scheduler.node.plan import NodeStatus
from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.policies.promise import FifoPromise
from ditmem.scheduler.node.simulator import simulate_node
from ditmem.scheduler.node.topology import Node
from ditmem.scheduler.noise import TimingNoise


def _simulate(requests, policy, devices, nc, **options):
    if policy == "slo":
        options.setdefault("guard", True)
    node = Node(devices, nc.links)
    pol = make_node_policy(policy, nc, node, **options)
    result = simulate_node(requests, pol, node, noise=TimingNoise(0.0))
    return pol, {r.request.id: r for r in result.records}


def _stream(nc, priority=1):
    """A 1024² (4 steps of 4 s, SLO 48 s) at 0, then a 512² (4 s, SLO 12 s) every 4 s."""
    rs = [req("L", 0, size=1024, steps=4, cost=nc.cost)]
    return rs + [
        req(f"s{i}", 1 + 4 * i, size=512, steps=4, priority=priority, cost=nc.cost)
        for i in range(6)
    ]


def test_promises_are_fifo_finishes_raised_to_the_running_max_flow():
    nc = node_cost()
    specs = [(0, 1024), (0, 512), (0.5, 512), (1, 1024), (2, 512), (3, 512), (9, 1024), (30, 512)]
    trace = [req(f"r{i}", at, size=size, steps=4, cost=nc.cost) for i, (at, size) in
             enumerate(specs)]
    _, fifo = _simulate([r.resubmitted(r.arrival) for r in trace], "fifo", 2, nc)
    pol, _ = _simulate(trace, "slo", 2, nc, forecast=False)
    worst = 0.0
    for r in trace:  # arrival order
        worst = max(worst, fifo[r.id].latency)
        assert pol.promises[r.id] == r.arrival + worst
        assert pol.promises[r.id] >= fifo[r.id].finished


def test_the_guard_keeps_the_fifo_finish_of_a_large_request_in_a_stream():
    nc = node_cost()
    # Without the guard the large request yields to the stream of small ones (earlier
    # deadlines) and finishes last, at 40 s; FIFO finishes it at 16 s.
    _, off = _simulate(_stream(nc), "slo", 1, nc, forecast=False, guard=False)
    assert off["L"].finished == 40.0
    assert all(r.met for r in off.values())
    # With every promise first (guard_yield 0) it keeps FIFO's 16 s, and every request its
    # promise: on one device with no slack that is FIFO's own schedule.
    pol, on = _simulate(_stream(nc), "slo", 1, nc, forecast=False, guard_yield=0.0)
    assert on["L"].finished == 16.0
    assert all(r.finished <= pol.promises[rid] + 1e-9 for rid, r in on.items())
    assert [on[f"s{i}"].finished for i in range(6)] == [20.0, 24.0, 28.0, 32.0, 36.0, 40.0]


def test_requests_about_to_miss_their_slo_go_before_the_promises():
    nc = node_cost()
    # guard_yield 0.1 for every priority: a small request within 1.2 s (0.1 × 12 s) of
    # missing goes first, so every small one meets its SLO and the large one's promise
    # (16 s) is broken.
    pol, out = _simulate(_stream(nc), "slo", 1, nc, forecast=False, guard_yield=0.1,
                         guard_yield_priority=2)
    assert all(r.met for r in out.values())
    assert out["L"].finished > pol.promises["L"]
    # The large one still ran its first two steps first (critical from t = 0): s0 (due at
    # 13 s) waits until 8 s, when only 1 s of its slack is left.
    assert out["s0"].finished == 12.0


def test_by_default_only_priority_0_goes_before_the_promise():
    nc = node_cost()
    # Guard on, default yield. Priority-1 small ones: the promise goes first (FIFO's 16 s
    # for the large one).
    _, p1 = _simulate(_stream(nc, priority=1), "slo", 1, nc, forecast=False)
    assert p1["L"].finished == 16.0
    # Priority 0: each small one goes first once a quarter of its window (3 s) is left.
    _, p0 = _simulate(_stream(nc, priority=0), "slo", 1, nc, forecast=False)
    assert all(p0[f"s{i}"].met for i in range(6))
    assert p0["L"].finished > 16.0


def test_the_guard_is_off_by_default():
    nc = node_cost()
    node = Node(1, nc.links)
    pol = make_node_policy("slo", nc, node, forecast=False)
    simulate_node(_stream(nc), pol, node, noise=TimingNoise(0.0))
    assert not pol.guard and pol.promises == {}


def test_a_promise_floor_lets_small_requests_go_first_within_it():
    nc = node_cost()
    # guard_floor f: each promise is at least arrival + f × the request's own time alone
    # at degree 1, so early in a trace (running maximum FIFO flow still low) a large
    # request is not critical at once. The small ones' promises are unchanged (their FIFO
    # finishes: f × 4 s is under the running maximum).
    pol, out = _simulate(_stream(nc), "slo", 1, nc, forecast=False, guard_yield=0.0,
                         guard_floor=2.0)
    assert pol.promises["L"] == 32.0  # max(FIFO's 16 s, 2 × 16 s)
    assert [pol.promises[f"s{i}"] for i in range(6)] == [20.0, 24.0, 28.0, 32.0, 36.0, 40.0]
    # L runs its first step (0-4 s); its latest start at degree 1 (32 − 3 steps × 4 s ×
    # 1.05 margin = 19.4 s) is more than one step (4.2 s) away until 16 s, so s0, s1 and s2
    # (arriving at 1, 5, 9 s; deadlines 13, 17, 21 s) run by deadline at 4-8, 8-12 and
    # 12-16 s; then L is critical and runs its last three steps, 16-28 s, inside its
    # promise. Without the floor (the test above) s0-s2 miss.
    assert out["L"].finished == 28.0 <= pol.promises["L"]
    assert [out[f"s{i}"].finished for i in range(3)] == [8.0, 12.0, 16.0]
    assert all(out[f"s{i}"].met for i in range(3))
    assert all(r.finished <= pol.promises[rid] + 1e-9 for rid, r in out.items())


def test_a_negative_promise_floor_is_refused():
    nc = node_cost()
    with pytest.raises(ValueError, match="guard_floor"):
        make_node_policy("slo", nc, Node(2, nc.links), guard_floor=-1.0)


def test_the_guard_stands_down_while_the_measured_load_is_above_guard_load():
    nc = node_cost()
    # The stream: 16 s (L) + 6 × 4 s of work alone, arriving over 0-21 s; the longest SLO
    # window is L's 48 s, the least span the estimate divides by. So the measured load on
    # one device is 16 / 48 = 0.33 from t = 0 and 40 / 48 = 0.83 once all have arrived.
    pol, on = _simulate(_stream(nc), "slo", 1, nc, forecast=False, guard_yield=0.0,
                        guard_load=1.0)
    assert pol.promise.measured_load(30.0) == 40 / 48
    assert on["L"].finished == 16.0  # always under 1.0: the guard keeps FIFO's 16 s
    # guard_load 0.3: over it from the first arrival, so step 0 never acts and the run is
    # the one without the guard (L last, at 40 s; every small one on time).
    _, off = _simulate(_stream(nc), "slo", 1, nc, forecast=False, guard_yield=0.0,
                       guard_load=0.3)
    assert off["L"].finished == 40.0
    assert all(r.met for r in off.values())


def test_a_negative_guard_load_is_refused():
    nc = node_cost()
    with pytest.raises(ValueError, match="guard_load"):
        make_node_policy("slo", nc, Node(2, nc.links), guard_load=-0.5)


class _Fake:
    """What ``FifoPromise.critical`` reads of a candidate: remaining and step times at
    degree 1, the request's id, and whether it is running."""

    def __init__(self, rid, rem, step, running=False):
        self.req = req(rid, 0.0)
        self._rem, self._step = rem, step
        self.item = NodeStatus(self.req, running=True) if running else None

    def rem(self, k):
        return self._rem

    def step(self, k):
        return self._step


def test_critical_requests_are_those_whose_latest_start_is_within_a_step():
    nc = node_cost()
    promise = FifoPromise(nc, Node(1, nc.links), margin=0.0)
    promise.promises.update({"a": 10.0, "b": 20.0, "c": 21.0})
    a, b, c = _Fake("a", 4.0, 1.0), _Fake("b", 6.0, 1.0), _Fake("c", 5.0, 1.0)
    # One device, latest promise first: c starts at 21 - 5 = 16, b at min(20, 16) - 6 = 10,
    # a at min(10, 10) - 4 = 6. At t = 5 only a starts within one step (6 - 5 <= 1).
    assert promise.critical(5.0, [a, b, c]) == [a]
    assert (a.promise, b.promise, c.promise) == (10.0, 20.0, 21.0)
    # At t = 9.5 b's latest start (10) is within a step too; by promise: a, then b.
    assert promise.critical(9.5, [c, b, a]) == [a, b]
    # A running one holds its place in the list schedule but is never critical itself.
    ra = _Fake("a", 4.0, 1.0, running=True)
    assert promise.critical(9.5, [ra, b, c]) == [b]
    # Two devices: b and c no longer queue behind each other (b starts at 14).
    two = FifoPromise(nc, Node(2, nc.links), margin=0.0)
    two.promises.update(promise.promises)
    assert two.critical(9.5, [a, b, c]) == [a]
