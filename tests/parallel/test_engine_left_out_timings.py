"""What ``EngineDevices`` reports of a job that could not run as the loop planned it: the
loop builds the policy's ``NodeReport`` from the job it launched (every planned member's
tokens, its moves in order, ``zip``-ed with ``Timings.move_s``), so a step that ran
without a failed member, or a failed move, must not be reported as if it ran as planned
(the step correction, per model, would learn a step of the rest — or of nothing, a few
microseconds — as the planned batch's; a later move's seconds would be learned as the
failed one's). Scripted node as ``test_engine_move_order``'s."""

from __future__ import annotations

from test_engine_move_order import ParkingNode, _req, _wait_for

from ditmem.parallel.devices import EngineDevices
from ditmem.parallel.node import MoveTiming
from ditmem.scheduler.node.device import Job, Move
from ditmem.scheduler.node.topology import Node


class SlowRestores(ParkingNode):
    """Restores take 0.5 s of their own (their ``MoveTiming``)."""

    def restore(self, rid, devices):
        super().restore(rid, devices)
        return MoveTiming(0.5)


def _slow_devices() -> EngineDevices:
    """``EngineDevices`` on a ``SlowRestores`` node with y parked (its parks not gated)."""
    node = SlowRestores({})
    node.parked.add("y")
    node.gate.set()
    return EngineDevices(node, lambda q: q)


def _last(devices, job_id):
    """``job_id``'s last completion (``_wait_for``'s)."""
    return next(c for c in reversed(_wait_for(devices, {job_id})) if c.last)


def test_a_step_without_a_planned_member_reports_no_step_time():
    """Job 0: a and r planned; r's restore fails (r is not parked), a steps alone. Job 1:
    r alone, already failed: nothing steps. Job 2, the control: a alone, as planned."""
    a, r = _req("a"), _req("r")
    node = ParkingNode({"a": (0,)})
    node.gate.set()
    g0, _ = Node(2).groups(1)
    devices = EngineDevices(node, lambda q: q)
    devices.launch(Job(0, g0, [a, r], 1, [Move(r, None, g0, "restore")], [], []), 0.0)
    first = _last(devices, 0)
    devices.launch(Job(1, g0, [r], 1, [], [], []), 0.0)
    second = _last(devices, 1)
    devices.launch(Job(2, g0, [a], 1, [], [], []), 0.0)
    control = _last(devices, 2)
    assert node.calls == [("step", [((0,), ["a"])])] * 2  # a stepped in jobs 0 and 2 only
    assert first.timings.step_s == 0.0 and second.timings.step_s == 0.0
    assert control.timings.step_s > 0.0


def test_a_failed_restore_keeps_the_later_moves_timings_in_the_jobs_order():
    """Job 0 restores r (fails: not parked) then y (0.5 s): ``move_s`` holds one entry per
    planned move, in order — nothing for r's, 0.5 s for y's."""
    r, y = _req("r"), _req("y")
    devices = _slow_devices()
    g0, _ = Node(2).groups(1)
    devices.launch(Job(0, g0, [r, y], 1, [Move(r, None, g0, "restore"),
                                          Move(y, None, g0, "restore")], [], []), 0.0)
    c = _last(devices, 0)
    assert c.timings.move_s == [0.0, 0.5]


def test_a_left_out_requests_move_keeps_its_place_in_the_jobs_order():
    """r failed in job 0; job 1 (the loop has not dropped r yet) restores r, then y
    (0.5 s): r's move is left out, and ``move_s`` still holds one entry per planned
    move — nothing for r's, 0.5 s for y's."""
    r, y = _req("r"), _req("y")
    devices = _slow_devices()
    g0, g1 = Node(2).groups(1)
    devices.launch(Job(0, g1, [r], 1, [Move(r, None, g1, "restore")], [], []), 0.0)
    _last(devices, 0)
    devices.launch(Job(1, g0, [r, y], 1, [Move(r, None, g0, "restore"),
                                          Move(y, None, g0, "restore")], [], []), 0.0)
    c = _last(devices, 1)
    assert len(devices.errors) == 1  # r's, once
    assert c.timings.move_s == [0.0, 0.5]
