"""A job hands its devices back one by one (the node loop with ``VirtualDevices``):
after its last step the devices with no decode, and each request as its own decode ends.
Hand-computed, noise off, a scripted policy (it places each request on a group chosen by
the test as soon as that group is free), so the times are the mechanism's alone.

Profile (node_factories): a 512² request steps in 1 s at any degree; a 1024² in 4 s at
degree 1, 2 s at degree 2; encode free; decode 8 s per 1024² (1.048576 MP), so 2 s per
512². Decodes run round-robin over the job's group, in the job's member order.
"""

from types import SimpleNamespace

import pytest
from node_factories import by_id, node_cost
from sched_factories import PAGE, req

from ditmem.scheduler.node.plan import Assignment, NodePlan
from ditmem.scheduler.node.policies.base import NodePolicy
from ditmem.scheduler.node.simulator import simulate_node
from ditmem.scheduler.node.topology import Group, Node
from ditmem.scheduler.noise import TimingNoise

MP_1024 = 1024 * 1024 / 1e6
DECODE = 8.0 / MP_1024  # s per MP: 1024² 8 s, 512² 2 s


class Script(NodePolicy):
    """Places each id of ``plan`` (id -> (degree, index) of its group, in order; ids of one
    group together form one batch) once it has arrived and its group is free; notes what
    each view showed (a copy: the loop's statuses change later)."""

    name = "script"

    def __init__(self, ncost, node, plan: dict[str, tuple[int, int]]):
        super().__init__(ncost, node)
        self.plan = plan
        self.views = []

    def schedule(self, view):
        self.views.append(SimpleNamespace(
            now=view.now, free=view.free, busy_until=list(view.busy_until),
            paused=[SimpleNamespace(id=x.id, steps_done=x.steps_done) for x in view.paused],
            running=[SimpleNamespace(id=x.id, steps_done=x.steps_done, group=x.group,
                                     job_end=x.job_end) for x in view.running]))
        here = {s.id for s in view.paused} | {rid for rid in self.plan if rid in view.waiting}
        batches: dict[Group, list[str]] = {}
        for rid, (degree, index) in self.plan.items():
            g = self.node.groups(degree)[index]
            if rid in here and g.mask & view.free == g.mask:
                batches.setdefault(g, []).append(rid)
        used, out = 0, []
        for g, ids in batches.items():
            if not g.mask & used:
                used |= g.mask
                out.append(Assignment(g, ids, 1))
        return NodePlan(out)


def _run(requests, plan):
    nc = node_cost(decode_s_per_mp=DECODE)
    for r in requests:
        nc.cost.assign_deadline(r, 3.0)
    node = Node(2, nc.links)
    policy = Script(nc, node, plan)
    result = simulate_node(requests, policy, node, noise=TimingNoise(0.0))
    return by_id(result), policy, nc, result


def test_a_degree_two_job_with_one_decode_frees_its_second_device_at_the_steps_end():
    """A 1024² (1 step) at degree 2 from t = 0: its step ends at 2 s, then it decodes on
    device 0 until 10 s. A 512² arriving at 0.5 s for device 1 starts there at 2 s (not
    at 10 s, when the whole job used to end): step 1 s + decode 2 s -> done at 5 s."""
    out, policy, _, result = _run(
        [req("big", 0.0, size=1024, steps=1), req("small", 0.5, size=512, steps=1)],
        {"big": (2, 0), "small": (1, 1)})
    assert out["big"].finished == pytest.approx(10.0)
    assert out["small"].finished == pytest.approx(5.0)
    assert out["small"].degrees == {1: 1}
    # device 1 was busy 0-2 (big) and 2-5 (small), device 0 0-10
    assert result.device_busy_s == pytest.approx(2.0 + 3.0 + 10.0)
    # the view at 2 s: device 1 free, big running alone on device 0 until its decode ends
    view = next(v for v in policy.views if v.now == pytest.approx(2.0))
    assert view.free == 0b10
    (big,) = view.running
    assert big.id == "big" and big.group == Group(1, 0)
    assert big.job_end == pytest.approx(10.0)
    assert view.busy_until[1] == pytest.approx(2.0)
    assert view.busy_until[0] == pytest.approx(10.0)


def test_two_requests_in_one_job_finish_at_their_own_decode_ends():
    """One degree-1 job of a 512² and a 1024² (1 step each, batched on device 0, step
    s): decodes in member order on device 0, the 512² done at s + 2, the 1024² at
    s + 2 + 8 (both at s + 10 when a job's members ended together)."""
    out, _, nc, _ = _run(
        [req("a", 0.0, size=512, steps=1), req("b", 0.0, size=1024, steps=1)],
        {"a": (1, 0), "b": (1, 0)})
    tokens = [nc.cost.tokens(out["a"].request), nc.cost.tokens(out["b"].request)]
    step = nc.step_time("qwen-image", tokens, 1)
    assert out["a"].finished == pytest.approx(step + 2.0)
    assert out["b"].finished == pytest.approx(step + 10.0)


def test_a_degree_two_jobs_decodes_run_on_both_devices_each_freed_at_its_own_end():
    """A degree-2 job of a 512² and a 1024² (step s): the 512² decodes on device 0 (done,
    device 0 free at s + 2), the 1024² on device 1 at once (done at s + 8). A third
    request for device 0, waiting from 0.1 s, starts at s + 2: 512², 1 s + 2 s."""
    out, _, nc, _ = _run(
        [req("a", 0.0, size=512, steps=1), req("b", 0.0, size=1024, steps=1),
         req("c", 0.1, size=512, steps=1)],
        {"a": (2, 0), "b": (2, 0), "c": (1, 0)})
    tokens = [nc.cost.tokens(out["a"].request), nc.cost.tokens(out["b"].request)]
    step = nc.step_time("qwen-image", tokens, 2)
    assert out["a"].finished == pytest.approx(step + 2.0)
    assert out["b"].finished == pytest.approx(step + 8.0)
    assert out["c"].finished == pytest.approx(step + 2.0 + 3.0)


def test_a_member_that_does_not_decode_is_paused_at_the_steps_end():
    """A 512² with 2 steps batched on device 0 with a 1024² finishing there (1 step, step
    s, decode 8 s): from s the 512² is shown paused (its step counted), the 1024² running
    (its decode), device 0 not free; the script keeps the 512² on device 0, so it resumes
    when the decode ends."""
    out, policy, nc, _ = _run(
        [req("a", 0.0, size=512, steps=2), req("b", 0.0, size=1024, steps=1)],
        {"a": (1, 0), "b": (1, 0)})
    tokens = [nc.cost.tokens(out["a"].request), nc.cost.tokens(out["b"].request)]
    step = nc.step_time("qwen-image", tokens, 1)
    view = next(v for v in policy.views if v.now == pytest.approx(step))
    assert [s.id for s in view.paused] == ["a"] and view.paused[0].steps_done == 1
    assert [s.id for s in view.running] == ["b"] and view.running[0].steps_done == 0
    assert view.free == 0b10  # device 0 still decodes b
    # a resumes on device 0 once b's decode ends: 1 s step + 2 s decode
    assert out["b"].finished == pytest.approx(step + 8.0)
    assert out["a"].finished == pytest.approx(step + 8.0 + 1.0 + 2.0)


def test_a_decode_whose_device_lacks_room_to_gather_stays_on_its_group(caplog):
    """Devices of 3 pages, a request of 4 (2 per device at degree 2): after its degree-2
    last step its decode device cannot hold it whole. The loop says so (a warning naming
    it), keeps its pages on the group (nothing over-committed: no device below 0 free), and
    it still finishes at step + decode (2 + 8 s); every page is free at the end."""
    nc = node_cost(decode_s_per_mp=DECODE, device_bytes=3 * PAGE, state_bytes=4 * PAGE)
    big = req("big", 0.0, size=1024, steps=1)
    nc.cost.assign_deadline(big, 3.0)
    node = Node(2, nc.links)
    seen = []

    class Watch(Script):
        def schedule(self, view):
            seen.append(list(view.free_pages))
            return super().schedule(view)

    with caplog.at_level("WARNING", logger="ditmem.scheduler.node.simulator"):
        result = simulate_node([big, req("late", 20.0, size=512, steps=1, cost=nc.cost)],
                               Watch(nc, node, {"big": (2, 0), "late": (2, 0)}), node,
                               noise=TimingNoise(0.0))
    assert "decode of big: device 0 lacks 1 pages" in caplog.text
    out = by_id(result)
    assert out["big"].finished == pytest.approx(10.0)
    assert all(p >= 0 for pages in seen for p in pages)
    assert seen[-1] == [3, 3]  # at the late arrival (20 s): big's pages all back
