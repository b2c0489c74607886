"""The node loop and its policies on hand-computed schedules (noise off).

Test profile (node_factories): a 512² request (1,024 tokens) steps in 1 s at any degree; a
1024² request (4,096 tokens) in 4 s at degree 1, 2 s at 2, 1.25 s at 4; state 1 MiB; peer
link 1 GB/s, host link 0.1 GB/s; encode and decode free.
"""

import pytest
from node_factories import by_id, node_cost, run
from sched_factories import PAGE, req

from ditmem.scheduler.node.plan import Assignment, NodePlan
from ditmem.scheduler.node.policies.base import NodePolicy
from ditmem.scheduler.node.simulator import simulate_node
from ditmem.scheduler.node.topology import Group, Node
from ditmem.scheduler.simulator import PlanError

MOVE_HALF = PAGE * 0.5 / 1e9  # a peer copy of half a request's state


def _reqs(nc, *specs):
    return [req(rid, at, size=size, steps=steps, slo_ms=slo, cost=nc.cost)
            for rid, at, size, steps, slo in specs]


def test_fifo_on_static_replicas_of_degree_1():
    nc = node_cost()
    rs = _reqs(nc, ("a", 0, 512, 4, None), ("b", 0, 512, 4, None), ("c", 0, 512, 4, None))
    out = by_id(run(rs, "fifo", 2, nc, baseline_degree=1))
    assert [out[i].finished for i in "abc"] == [4.0, 4.0, 8.0]
    assert out["c"].started == 4.0
    assert all(r.degrees == {1: 4} for r in out.values())


def test_fifo_on_static_replicas_of_degree_2():
    nc = node_cost()
    rs = _reqs(nc, ("x", 0, 1024, 4, None), ("y", 0, 1024, 4, None))
    out = by_id(run(rs, "fifo", 2, nc, baseline_degree=2))
    assert out["x"].finished == pytest.approx(8.0)
    assert out["y"].finished == pytest.approx(16.0)
    assert out["y"].degrees == {2: 4}


def test_srtf_preempts_at_a_step_boundary():
    nc = node_cost()
    rs = _reqs(nc, ("long", 0, 512, 8, None), ("short", 0.5, 512, 2, None))
    out = by_id(run(rs, "srtf", 1, nc))
    assert out["short"].finished == pytest.approx(3.0)  # waits for long's first step
    assert out["long"].finished == pytest.approx(10.0)
    assert out["long"].preemptions == 1


def test_elastic_np_picks_the_least_degree_that_meets_the_deadline():
    nc = node_cost()
    rs = _reqs(nc, ("x9", 0, 1024, 4, 9000), ("s", 0, 512, 4, None))
    out = by_id(run(rs, "elastic-np", 4, nc))
    assert out["x9"].degrees == {2: 4} and out["x9"].finished == pytest.approx(8.0)
    assert out["s"].degrees == {1: 4} and out["s"].finished == pytest.approx(4.0)
    rs = _reqs(nc, ("x5", 0, 1024, 4, 5000))
    out = by_id(run(rs, "elastic-np", 4, nc))
    assert out["x5"].degrees == {4: 4} and out["x5"].finished == pytest.approx(5.0)


def test_elastic_np_never_preempts():
    nc = node_cost()
    rs = _reqs(nc, ("long", 0, 512, 8, None), ("short", 0.5, 512, 1, None))
    out = by_id(run(rs, "elastic-np", 1, nc))
    assert out["long"].finished == pytest.approx(8.0) and out["long"].preemptions == 0
    assert out["short"].finished == pytest.approx(9.0)


def test_slo_gives_a_lone_large_request_the_spare_devices():
    nc = node_cost()
    out = by_id(run(_reqs(nc, ("big", 0, 1024, 4, None)), "slo", 2, nc, forecast=False))
    assert out["big"].degrees == {2: 4}
    assert out["big"].finished == pytest.approx(8.0)


def test_slo_changes_degree_between_steps_and_migrates():
    """B (1024², 8 steps) runs alone at degree 2 (2 s/step); s (512²) arrives at t=3 and,
    at B's step boundary t=4, B drops to degree 1 on device 1 (re-sharding: device 1 gets
    the half it lacks from device 0) while s runs on device 0 — after that copy, which
    reads from device 0; when s is done, B goes back to degree 2 on 0-1 (device 0 gets half
    its state again)."""
    nc = node_cost()
    rs = _reqs(nc, ("B", 0, 1024, 8, None), ("s", 3.0, 512, 4, None))
    out = by_id(run(rs, "slo", 2, nc, forecast=False))
    assert out["s"].started == pytest.approx(4.0)
    assert out["s"].finished == pytest.approx(8.0 + MOVE_HALF, abs=1e-9)
    assert out["B"].degrees == {2: 7, 1: 1}
    assert out["B"].migrations == 2
    assert out["B"].finished == pytest.approx(4 + MOVE_HALF + 4 + MOVE_HALF + 5 * 2.0)


def test_memory_pressure_parks_a_paused_request_on_the_host():
    """One page per device: when the short request starts, the paused long one is parked
    on the host (1 MiB at 0.1 GB/s) and restored after."""
    nc = node_cost(device_bytes=PAGE)
    rs = _reqs(nc, ("long", 0, 512, 8, None), ("short", 0.5, 512, 2, None))
    out = by_id(run(rs, "srtf", 1, nc))
    hop = PAGE / 1e8
    assert out["long"].offloads == 1
    assert out["short"].finished == pytest.approx(3.0 + hop)
    assert out["long"].finished == pytest.approx(10.0 + 2 * hop)


class _Scripted(NodePolicy):
    name = "scripted"

    def __init__(self, ncost, node, plans):
        super().__init__(ncost, node)
        self.plans = list(plans)

    def schedule(self, view):
        return self.plans.pop(0) if self.plans else NodePlan()


@pytest.mark.parametrize(
    "plans, message",
    [
        ([NodePlan([Assignment(Group(1, 0), ["a"]), Assignment(Group(2, 0), ["b"])])],
         "not free"),
        ([NodePlan([Assignment(Group(1, 0), ["a"], steps=5)])], "steps exceed"),
        ([NodePlan([Assignment(Group(1, 0), ["zz"])])], "neither started nor waiting"),
        ([NodePlan([Assignment(Group(1, 0), ["a", "a"])])], "repeats"),
        ([NodePlan()], "stalled"),
    ],
)
def test_broken_plans_raise_plan_error(plans, message):
    nc = node_cost()
    rs = _reqs(nc, ("a", 0, 512, 4, None), ("b", 0, 512, 4, None))
    node = Node(2, nc.links)
    with pytest.raises(PlanError, match=message):
        simulate_node(rs, _Scripted(nc, node, plans), node)


def test_every_policy_finishes_every_request_on_a_mixed_trace():
    nc = node_cost()
    specs = [(f"r{i}", 0.7 * i, 1024 if i % 3 == 0 else 512, 3 + i % 4, None) for i in range(20)]
    for policy in ("fifo", "srtf", "elastic-np", "slo"):
        result = run(_reqs(nc, *specs), policy, 4, nc)
        assert len(result.records) == 20
        assert all(sum(r.degrees.values()) == r.request.steps for r in result.records)
        assert all(r.finished > r.request.arrival for r in result.records)


def test_slo_runs_a_crowd_of_large_requests_at_low_degree():
    """Four 1024² requests at once on 4 devices: one round at degree 1 (16 s) beats two
    rounds at degree 2 (2 × 8 s = 16 s: a tie keeps the lower degree) and four at degree 4
    (4 × 5 s); so all four run side by side at degree 1, none waits."""
    nc = node_cost()
    rs = _reqs(nc, *[(f"b{i}", 0, 1024, 4, None) for i in range(4)])
    out = by_id(run(rs, "slo", 4, nc, forecast=False))
    assert all(r.degrees == {1: 4} for r in out.values())
    assert all(r.finished == pytest.approx(16.0) for r in out.values())


def test_slo_batches_small_requests_only_when_every_member_keeps_its_deadline():
    """Table profile: a batch costs the sum of its members (no gain), so slo never batches
    (the step would grow by a whole joiner's step); two 512² requests on one device run
    one after the other."""
    nc = node_cost()
    rs = _reqs(nc, ("a", 0, 512, 2, None), ("b", 0, 512, 2, None))
    out = by_id(run(rs, "slo", 1, nc, forecast=False))
    assert sorted(r.finished for r in out.values()) == [pytest.approx(2.0), pytest.approx(4.0)]


def test_slo_batch_with_a_gain_and_its_deadline_guard():
    """With a measured batch of two 512² at 1.2 s per step, two requests left without a
    device share one (2 steps: both done at 2.4 s). When one of them is due at 2.5 s, a
    two-step batch would leave it no 10 % margin (1.1 × 2.4 s > 2.5 s): it runs its first
    step alone (to 1.0 s); then one batched step (1.1 × 1.2 s fits) ends it at 2.2 s, and
    the other's last step runs alone, to 3.2 s (the rule is applied step by step)."""
    batch = [{"tokens": 1024, "batch": 2, "seconds": 1.2}]
    nc = node_cost(batch_points=batch)
    rs = _reqs(nc, ("a", 0, 512, 2, None), ("b", 0, 512, 2, None))
    out = by_id(run(rs, "slo", 1, nc, forecast=False))
    assert [out[i].finished for i in "ab"] == [pytest.approx(2.4), pytest.approx(2.4)]
    nc = node_cost(batch_points=batch)
    rs = _reqs(nc, ("a", 0, 512, 2, 2500), ("b", 0, 512, 2, None))
    out = by_id(run(rs, "slo", 1, nc, forecast=False))
    assert out["a"].finished == pytest.approx(2.2) and out["b"].finished == pytest.approx(3.2)
