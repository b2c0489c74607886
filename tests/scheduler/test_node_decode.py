"""``slo`` on a node where the decode (a single-device stage on one device of its job's group)
is long, and the loop's view of when a finished job's devices are free. Hand-computed.

Profile (node_factories): a 512² request steps in 1 s at any degree; a 1024² in 4 s at
degree 1, 2 s at degree 2; state 1 MiB, peer link 1 GB/s, host link 0.1 GB/s; encode free;
decode as each test sets it (per megapixel: a 1024² is 1.048576 MP, a 512² a quarter).
"""

import pytest
from node_factories import by_id, node_cost, run
from sched_factories import req

from ditmem.scheduler import WaitingQueue
from ditmem.scheduler.node.plan import Assignment, NodePlan, NodeStatus, NodeView
from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.policies.base import NodePolicy
from ditmem.scheduler.node.simulator import simulate_node
from ditmem.scheduler.node.topology import Node
from ditmem.scheduler.noise import TimingNoise

MP_1024 = 1024 * 1024 / 1e6


def test_last_step_keeps_degree_2_with_a_long_decode_its_second_device_freed():
    """A lone 1024² (4 steps) with an 8-s decode on 2 devices: all four steps at degree 2
    (2 s each), then the decode on device 0 alone: done at 8 + 8 s. A 512² (1 step, 2-s
    decode) arriving at 8.5 s runs on device 1 at once (device 1 went back at 8 s): done
    at 8.5 + 1 + 2 s. (Until session 7 the last step ran at degree 1 — the decode held
    the whole group — and the 512² waited.)"""
    nc = node_cost(decode_s_per_mp=8.0 / MP_1024)
    rs = [req("big", 0, size=1024, steps=4, cost=nc.cost),
          req("small", 8.5, size=512, steps=1, cost=nc.cost)]
    out = by_id(run(rs, "slo", 2, nc, forecast=False))
    assert out["big"].degrees == {2: 4}
    assert out["big"].finished == pytest.approx(16.0)
    assert out["small"].degrees == {1: 1}
    assert out["small"].finished == pytest.approx(11.5)


def test_last_step_keeps_its_degree_when_the_decode_is_short():
    """The same request with a 1-s decode (shorter than a 4-s step): the cap does not
    apply, all four steps at degree 2: 8 + 1 s."""
    nc = node_cost(decode_s_per_mp=1.0 / MP_1024)
    out = by_id(run([req("big", 0, size=1024, steps=4, cost=nc.cost)], "slo", 2, nc,
                    forecast=False))
    assert out["big"].degrees == {2: 4}
    assert out["big"].finished == pytest.approx(9.0)


def _view(nc, now, *, paused, waiting=(), running=()):
    """Two devices; device 0 runs ``running`` (busy until its job_end), device 1 is free."""
    node = Node(2, nc.links)
    queue = WaitingQueue()
    for r in waiting:
        queue.push(r)
    busy = [max([s.job_end for s in running] + [now]), now]
    return NodeView(now, node, 0b10, list(paused), list(running), queue, [1000, 1000],
                    10_000, nc.cost.page_bytes, None, busy)


def _setup(p_deadline: float, p_arrival: float = 0.0):
    """At t=20: R (1024²) runs on device 0 until t=30; P (1024², 1 step left: a 4-s step
    and a 1-s decode) is paused on device 1 with deadline ``p_deadline``."""
    nc = node_cost(decode_s_per_mp=1.0 / MP_1024)
    node = Node(2, nc.links)
    r = req("R", 0, size=1024, steps=8, cost=nc.cost)
    r.deadline = 200.0
    running = NodeStatus(r, steps_done=2, group=node.groups(1)[0], pages=1, running=True,
                         job_end=30.0)
    p = req("P", p_arrival, size=1024, steps=4, cost=nc.cost)
    p.deadline = p_deadline
    paused = NodeStatus(p, steps_done=3, group=node.groups(1)[1], pages=1)
    return nc, node, running, paused


def _small(rid: str, arrival: float, deadline: float, nc):
    """A 512² of one step: 1 s and a 0.25-s decode."""
    w = req(rid, arrival, size=512, steps=1, cost=nc.cost)
    w.deadline = deadline
    return w


def _batches(plan: NodePlan) -> list[list[str]]:
    return [a.batch for a in plan.assignments]


def test_decode_guard_lets_a_request_due_first_go_before_an_urgent_last_step():
    """P is urgent (slack 27 − 20 − 5 = 2 s, under half its 27-s window) and goes first by
    the urgent rule; W (512², due at 23.25: slack 2 s, not urgent: half its 3.25-s window
    is 1.625 s) is due before it. Device 1 is the only free one, device 0
    is held until t=30: P's 5-s job there would make W miss (EDF runs W first). The guard
    gives W device 1 (and P waits for it: W ends at 21.25, P then at 26.25 < 27)."""
    nc, node, running, paused = _setup(27.0)
    w = _small("W", 20.0, 23.25, nc)
    view = _view(nc, 20.0, paused=[paused], waiting=[w], running=[running])
    pol = make_node_policy("slo", nc, node, forecast=False)
    assert _batches(pol.schedule(view)) == [["W"]]


def test_decode_guard_keeps_a_device_for_the_next_arrival():
    """The policy has seen W (slack 2 s: the tightest). Later, with W gone, P (not urgent:
    deadline 100) would run its 5-s last step and decode on device 1 while device 0 is held
    until t=30: an arrival like W would find no device within its slack, so P waits (the
    plan is empty). Urgent, P goes (deadline 27, window 27)."""
    nc, node, running, paused = _setup(100.0)
    w = _small("W", 20.0, 23.25, nc)
    pol = make_node_policy("slo", nc, node, forecast=False)
    pol.schedule(_view(nc, 20.0, paused=[paused], waiting=[w], running=[running]))
    assert pol.schedule(_view(nc, 20.0, paused=[paused], running=[running])).idle
    nc, node, running, urgent = _setup(27.0)
    pol = make_node_policy("slo", nc, node, forecast=False)
    pol.schedule(_view(nc, 20.0, paused=[urgent], waiting=[w], running=[running]))
    assert _batches(pol.schedule(_view(nc, 20.0, paused=[urgent], running=[running]))) == [
        ["P"]]


@pytest.mark.parametrize("j_deadline, batches", [(6.45, [["J"]]), (6.55, [["J", "A"]])])
def test_batch_join_counts_the_decodes_ahead_of_the_joiner(j_deadline, batches):
    """One device at t=5: J (512², 1 step) goes first (by deadline, and urgent); A (512², 1
    step left, due at 10) would join J's step (two 512² cost 1 s here, as one). Both decode
    in that job (0.25 s each, one after the other), so with A's decode counted J would end
    1 + 0.5 s after now: past J's deadline at 6.45 (A is refused; without A's decode, 6.25,
    it would be in time), within it at 6.55 (A joins). No margin (``margin=0``)."""
    nc = node_cost(decode_s_per_mp=1.0 / MP_1024,
                   batch_points=[{"tokens": 1024, "batch": 2, "seconds": 1.0}])
    node = Node(1, nc.links)
    a = req("A", 0, size=512, steps=4, cost=nc.cost)
    a.deadline = 10.0
    j = _small("J", 5.0, j_deadline, nc)
    queue = WaitingQueue()
    queue.push(j)
    view = NodeView(5.0, node, 0b1, [NodeStatus(a, steps_done=3, group=node.groups(1)[0],
                                                pages=1)], [], queue, [1000], 10_000,
                    nc.cost.page_bytes, None, [5.0])
    pol = make_node_policy("slo", nc, node, forecast=False, margin=0.0)
    assert _batches(pol.schedule(view)) == batches


class _Recorder(NodePolicy):
    """Runs the one request on device 0, one step a job; keeps each view's busy_until."""

    name = "recorder"

    def __init__(self, ncost, node):
        super().__init__(ncost, node)
        self.seen: list[tuple[float, list[float]]] = []

    def schedule(self, view: NodeView) -> NodePlan:
        self.seen.append((view.now, list(view.busy_until)))
        items = [s.id for s in view.paused] + [r.id for r in view.waiting.iter_by("arrival")]
        return NodePlan([Assignment(self.node.groups(1)[0], items[:1], 1)])


def test_a_job_that_ends_early_frees_its_devices_in_the_view():
    """The truth runs at half the profile's time (bias −0.5): each 1-s step ends after
    0.5 s. At each later decision, device 0's busy_until is that job's end (now), not the
    predicted 1 s after its start."""
    nc = node_cost()
    node = Node(2, nc.links)
    pol = _Recorder(nc, node)
    simulate_node([req("a", 0, size=512, steps=3, cost=nc.cost)], pol, node,
                  noise=TimingNoise(0.0, -0.5))
    assert [now for now, _ in pol.seen] == pytest.approx([0.0, 0.5, 1.0])
    for now, busy in pol.seen[1:]:
        assert busy[0] == pytest.approx(now)
