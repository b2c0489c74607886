"""Moves priced as the node engine pays them: a fixed latency per move command from the
profile's ``links``, an online factor per kind of move, and the wait for the devices a move
reads from — another job's step on them — in the truth (``VirtualDevices``), in the loop's
prediction and in ``slo``'s plan. Hand-computed on the node test profile: 512² steps in 1 s,
1024² in 4 s at degree 1 (2 s at 2); state 1 MiB; peer link 1 GB/s, host link 0.1 GB/s."""

import json
import math

import pytest
from node_factories import by_id, node_cost, node_profile
from sched_factories import PAGE, req

from ditmem.scheduler import WaitingQueue
from ditmem.scheduler.node.device import Job, Move, VirtualDevices
from ditmem.scheduler.node.plan import Assignment, NodePlan, NodeStatus, NodeView
from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.policies.base import NodePolicy
from ditmem.scheduler.node.simulator import simulate_node
from ditmem.scheduler.node.speedup import NodeProfileError, parse_links
from ditmem.scheduler.node.topology import Group, Node
from ditmem.scheduler.noise import TimingNoise

PEER = PAGE / 1e9  # a peer copy of a whole request's state
HOST = PAGE / 1e8  # a park or a restore of it at degree 1


# ---- the profile's move latency -------------------------------------------------------------
def test_a_profile_with_move_latency_round_trips():
    prof = node_profile(move_latency=0.15)
    links = parse_links(prof)
    assert links.move_latency_s == 0.15
    again = parse_links({"name": "x", "links": json.loads(json.dumps(links.to_dict()))})
    assert again == links
    assert parse_links(node_profile()).move_latency_s == 0.0  # absent: no fixed cost


@pytest.mark.parametrize("bad", [-0.1, math.inf, "0.1", True, None])
def test_a_bad_move_latency_names_the_field(bad):
    prof = node_profile()
    prof["links"]["move_latency_s"] = bad
    with pytest.raises(NodeProfileError, match="links.move_latency_s"):
        parse_links(prof)


def test_move_latency_is_paid_per_move_command():
    nc = node_cost(move_latency=0.1)
    r = req("r", size=512)
    assert nc.restore_time(r, Group(2, 0)) == pytest.approx(HOST / 2 + 0.1)
    assert nc.offload_time(r, Group(1, 0)) == pytest.approx(HOST + 0.1)
    assert nc.move_time(r, Group(1, 0), Group(1, 1)) == (pytest.approx(PEER + 0.1), "peer")
    slow = node_cost(peer=1e6, move_latency=0.1)  # through the host: two commands
    assert slow.move_time(r, Group(1, 0), Group(1, 1)) == (pytest.approx(2 * HOST + 0.2), "host")


# ---- learning moves online ------------------------------------------------------------------
def test_observe_move_converges_to_the_measured_ratio_per_kind():
    nc = node_cost(move_latency=0.01)
    r = req("r", size=512)
    for _ in range(200):
        predicted, kind = nc.move_time(r, Group(1, 0), Group(1, 1))
        nc.observe_move(kind, predicted, 3.0 * (PEER + 0.01))  # the engine: 3 x the model
    assert nc.move_correction("peer") == pytest.approx(3.0, rel=1e-3)
    assert nc.move_time(r, Group(1, 0), Group(1, 1))[0] == pytest.approx(3 * (PEER + 0.01), 1e-3)
    assert nc.move_correction("restore") == 1.0  # other kinds untouched
    assert nc.restore_time(r, Group(1, 0)) == pytest.approx(HOST + 0.01)
    nc.observe_move("restore", 0.0, 1.0)  # nothing predicted: nothing learned
    assert nc.move_correction("restore") == 1.0
    with pytest.raises(ValueError, match="kind"):
        nc.observe_move("teleport", 1.0, 1.0)


def test_the_simulated_policy_learns_slow_moves_from_the_devices():
    """The truth's moves take 100 ms each (its profile), the policy's model thinks 0: the
    reports of the jobs that moved state teach the policy's NodeCost."""
    truth = node_cost(move_latency=0.1)
    ncost = node_cost()
    node = Node(2, ncost.links)
    rs = [req("B", 0, size=1024, steps=8, cost=ncost.cost), req("s", 3.0, size=512, steps=4,
                                                                cost=ncost.cost)]
    pol = make_node_policy("slo", ncost, node, forecast=False)
    out = by_id(simulate_node(rs, pol, node, noise=TimingNoise(0.0), truth=truth))
    assert out["B"].migrations == 2  # B re-sharded 2 -> 1 -> 2 (see test_node_simulator)
    ratio = (PEER / 2 + 0.1) / (PEER / 2)  # measured / predicted, each half-state copy
    assert ncost.move_correction("peer") == pytest.approx(1 + (1 - 0.9**2) * (ratio - 1))


# ---- a move waits for its devices -----------------------------------------------------------
def test_a_move_whose_source_is_mid_step_waits_for_that_step():
    """Device 0 runs q's step from t=0 to 4. At t=1 a job on device 1 resumes p, whose state
    is on device 0: the copy starts at 4, when device 0 is free, and p steps after it; a job
    launched on device 0 at 4 waits for that copy (device 0 is sending)."""
    nc = node_cost()
    p, q, r = req("p", size=512), req("q", size=1024), req("r", size=512)
    devices = VirtualDevices(nc, TimingNoise(0.0), 2)
    devices.launch(Job(0, Group(1, 0), [q], 1), 0.0)
    devices.launch(Job(1, Group(1, 1), [p], 1, [Move(p, Group(1, 0), Group(1, 1))]), 1.0)
    first = devices.wait(None)[0]
    assert first.job.job_id == 0 and first.finished == 4.0
    devices.launch(Job(2, Group(1, 0), [r], 1), 4.0)
    done = {c.job.job_id: c for c in devices.wait(None) + devices.wait(None)}
    second, third = done[1], done[2]
    assert second.timings.wait_s == pytest.approx(3.0)
    assert second.timings.move_s == [pytest.approx(PEER)]
    assert second.finished == pytest.approx(4.0 + PEER + 1.0)
    assert third.job.job_id == 2 and third.timings.wait_s == pytest.approx(PEER)
    assert third.finished == pytest.approx(4.0 + PEER + 1.0)


def test_a_restore_from_the_host_waits_for_nothing():
    nc = node_cost()
    p, q = req("p", size=512), req("q", size=1024)
    devices = VirtualDevices(nc, TimingNoise(0.0), 2)
    devices.launch(Job(0, Group(1, 0), [q], 1), 0.0)
    devices.launch(Job(1, Group(1, 1), [p], 1, [Move(p, None, Group(1, 1))]), 1.0)
    done = devices.wait(None)[0]
    assert done.job.job_id == 1 and done.timings.wait_s == 0.0
    assert done.finished == pytest.approx(1.0 + HOST + 1.0)


class _Script(NodePolicy):
    """Runs fixed plans (one per decision) and records the views it saw."""

    name = "script"

    def __init__(self, ncost, node, plans):
        super().__init__(ncost, node)
        self.plans, self.views = list(plans), []

    def schedule(self, view):
        self.views.append(view)
        if not self.plans:
            return NodePlan()
        plan = self.plans.pop(0)
        return NodePlan(plan(view) if callable(plan) else plan)


@pytest.mark.parametrize("move_first", [False, True])
def test_the_loop_charges_the_wait_in_the_predicted_end(move_first):
    """p (512², 2 steps) steps at degree 2 on 0-1 (t 0-1). At t=1, q (1024², 4 s) starts on
    device 1 and p resumes on device 0: p's re-shard reads the half of its state on device 1.
    Planned after q's job, the copy waits for q's step (1-5): p ends at 5 + copy + 1, as the
    loop predicts (the next view's job_end) — q's devices busy until 5 then sending. Planned
    first, the copy runs at once and q waits for it instead."""
    nc = node_cost()
    node = Node(2, nc.links)
    p = req("p", 0, size=512, steps=2, cost=nc.cost)
    q = req("q", 0.5, size=1024, steps=1, cost=nc.cost)
    r = req("r", 4.5, size=512, steps=1, cost=nc.cost)  # to see the view at t=5
    second = [Assignment(Group(1, 1), ["q"]), Assignment(Group(1, 0), ["p"])]
    third = lambda v: [Assignment(Group(1, 0 if v.free & 1 else 1), ["r"])]  # noqa: E731
    pol = _Script(nc, node, [[Assignment(Group(2, 0), ["p"])],
                             second[::-1] if move_first else second, third])
    out = by_id(simulate_node([p, q, r], pol, node, noise=TimingNoise(0.0)))
    half = PEER / 2
    if move_first:
        assert out["p"].finished == pytest.approx(1 + half + 1)
        assert out["q"].finished == pytest.approx(1 + half + 4)
        return
    assert out["q"].finished == pytest.approx(5.0)
    assert out["p"].finished == pytest.approx(5 + half + 1)
    at5 = pol.views[-1]
    assert at5.now == pytest.approx(5.0)
    assert [s.job_end for s in at5.running] == [pytest.approx(5 + half + 1)]
    assert at5.busy_until == [pytest.approx(5 + half + 1), pytest.approx(5 + half)]
    assert out["r"].finished == pytest.approx(5 + half + 1)  # after device 1's send


def test_slo_does_not_move_a_paused_request_off_a_device_mid_step():
    """p (512², paused, state on device 0) and device 0 running q's step until t=10;
    device 1 free. A move of p to device 1 would wait 10 s (> 1 step of p): slo leaves p for
    the next decision. When q's step ends at 0.5 s (< one step of p), slo moves p."""
    nc = node_cost()
    node = Node(2, nc.links)
    p = req("p", 0, size=512, steps=4, slo_ms=60_000, cost=nc.cost)
    q = req("q", 0, size=1024, steps=4, slo_ms=60_000, cost=nc.cost)

    def view(q_end):
        paused = NodeStatus(p, steps_done=1, group=Group(1, 0), pages=1)
        running = NodeStatus(q, steps_done=1, group=Group(1, 0), pages=1, running=True,
                             job_end=q_end)
        return NodeView(0.0, node, 0b10, [paused], [running], WaitingQueue(), [100, 100],
                        100, PAGE, None, [q_end, 0.0])

    pol = make_node_policy("slo", nc, node, forecast=False)
    assert pol.schedule(view(10.0)).assignments == []
    plan = pol.schedule(view(0.5))
    assert [(a.group, a.batch) for a in plan.assignments] == [(Group(1, 1), ["p"])]


def test_slo_moves_an_urgent_request_off_a_busy_device_whatever_the_wait():
    """As above, but p's deadline is 4.5 s away with 3 s of work left (slack 1.5 s < 0.35 of
    its 4.5-s window): urgent, it is moved to device 1 even though the copy waits 10 s for
    device 0, more than one of its steps (else a request spread over busy devices could
    wait for ever)."""
    nc = node_cost()
    node = Node(2, nc.links)
    p = req("p", 0, size=512, steps=4, slo_ms=4_500, cost=nc.cost)
    q = req("q", 0, size=1024, steps=4, slo_ms=60_000, cost=nc.cost)
    paused = NodeStatus(p, steps_done=1, group=Group(1, 0), pages=1)
    running = NodeStatus(q, steps_done=1, group=Group(1, 0), pages=1, running=True,
                         job_end=10.0)
    view = NodeView(0.0, node, 0b10, [paused], [running], WaitingQueue(), [100, 100], 100,
                    PAGE, None, [10.0, 0.0])
    pol = make_node_policy("slo", nc, node, forecast=False)
    plan = pol.schedule(view)
    assert [(a.group, a.batch) for a in plan.assignments] == [(Group(1, 1), ["p"])]


def _displacing_view(nc, node):
    """Device 1 runs q until t=10; device 0 is free and holds the state of the paused p
    (lax deadline); r (waiting, 4 s of work due at 5 s: urgent) takes device 0."""
    p = req("p", 0, size=512, steps=4, slo_ms=600_000, cost=nc.cost)
    q = req("q", 0, size=1024, steps=4, slo_ms=600_000, cost=nc.cost)
    r = req("r", 0, size=512, steps=4, slo_ms=5_000, cost=nc.cost)
    waiting = WaitingQueue()
    waiting.push(r)
    paused = NodeStatus(p, steps_done=1, group=Group(1, 0), pages=1)
    running = NodeStatus(q, steps_done=1, group=Group(1, 1), pages=1, running=True,
                         job_end=10.0)
    return NodeView(0.0, node, 0b01, [paused], [running], waiting, [100, 100], 100, PAGE,
                    None, [0.0, 10.0])


def test_slo_parks_a_displaced_request_while_its_device_is_free():
    """r's job on device 0 first parks p (1 MiB at 0.1 GB/s = 10 ms, and as much to restore
    it: less than r's 1 s step): p can later resume anywhere without waiting for r's step."""
    nc = node_cost()
    node = Node(2, nc.links)
    plan = make_node_policy("slo", nc, node, forecast=False).schedule(_displacing_view(nc, node))
    assert [(a.group, a.batch, a.offload) for a in plan.assignments] == [
        (Group(1, 0), ["r"], ["p"])
    ]
    off = make_node_policy("slo", nc, node, forecast=False, park=False)
    assert off.schedule(_displacing_view(nc, node)).assignments[0].offload == []
    slow = node_cost(host=1e6)  # a park + restore of 2 s costs more than r's step: kept
    plan = make_node_policy("slo", slow, node, forecast=False).schedule(
        _displacing_view(slow, node))
    assert plan.assignments[0].offload == []
