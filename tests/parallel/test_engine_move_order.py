"""``EngineDevices`` runs each job on its own thread; a request's moves must still happen
in the order the loop launched them. The case a real two-device demo hit (session 11):
the loop parks a paused request in a job on device 0 and, at the same instant, restores it
from the host in a job on device 1. Here the park is held back (a gate) so the restore's
thread gets there first; a scripted node with the ``NodeEngine``'s rule (a restore of a
request not yet parked raises ``KeyError``)."""

from __future__ import annotations

import threading
import time

from ditmem.parallel.devices import EngineDevices
from ditmem.parallel.node import MoveTiming
from ditmem.scheduler import Request
from ditmem.scheduler.node.device import Job, Move
from ditmem.scheduler.node.topology import Node


class ParkingNode:
    """Holds, parks and restores as ``NodeEngine`` does (by id, no tensors); ``park``
    waits for ``gate``. ``calls`` in the order they completed."""

    def __init__(self, held: dict[str, tuple[int, ...]]):
        self.holders = dict(held)
        self.parked: set[str] = set()
        self.failed: dict[str, str] = {}
        self.dead: dict[int, str] = {}
        self.gate = threading.Event()
        self.calls: list[tuple] = []
        self._lock = threading.Lock()

    def park(self, rid):
        self.gate.wait(10)
        with self._lock:
            del self.holders[rid]
            self.parked.add(rid)
            self.calls.append(("park", rid))
        return MoveTiming(0.0)

    def restore(self, rid, devices):
        with self._lock:
            if rid not in self.parked:
                raise KeyError(f"resume: {rid!r} is not parked")
            self.parked.discard(rid)
            self.holders[rid] = devices
            self.calls.append(("restore", rid, devices))
        return MoveTiming(0.0)

    def step(self, plan):
        with self._lock:
            for devices, ids in plan:
                for rid in ids:
                    if self.holders.get(rid) != devices:
                        raise KeyError(f"{rid!r} is not held on {devices}")
            self.calls.append(("step", plan))

    def release(self, rid):
        self.holders.pop(rid, None)


def _wait_for(devices, jobs, limit_s=20.0) -> list:
    """Until every job in ``jobs`` has ended (its last event), at most ``limit_s``; the
    completions seen."""
    deadline, seen = time.monotonic() + limit_s, []
    while {c.job.job_id for c in seen if c.last} != jobs:
        assert time.monotonic() < deadline, f"jobs {jobs} did not all end"
        seen += devices.wait(1.0)
    return seen


def _open_devices(held: dict[str, tuple[int, ...]]):
    """A ``ParkingNode`` holding ``held`` (its parks not gated) behind ``EngineDevices``:
    (node, devices, the ids ``on_failed`` was called with)."""
    node = ParkingNode(held)
    node.gate.set()
    failed: list[str] = []
    devices = EngineDevices(node, lambda q: q, on_failed=lambda rid, exc: failed.append(rid))
    return node, devices, failed


def _req(rid):
    return Request(rid, 0.0, width=64, height=64, steps=4)


def test_a_restore_launched_after_a_park_of_the_same_request_waits_for_it():
    """Job 0 on device 0 parks r (paused there) and steps x; job 1 on device 1, launched
    right after, restores r from the host and steps it. r's park is gated until job 1's
    thread has had time to reach its restore: the restore waits, then runs; nothing fails
    and the calls come in the loop's order."""
    r, x = _req("r"), _req("x")
    node = ParkingNode({"r": (0,), "x": (0,)})
    g0, g1 = Node(2).groups(1)
    failed = []
    devices = EngineDevices(node, lambda q: q, on_failed=lambda rid, exc: failed.append(rid))
    devices.launch(Job(0, g0, [x], 1, [Move(r, g0, None, "offload")], [], []), 0.0)
    devices.launch(Job(1, g1, [r], 1, [Move(r, None, g1, "restore")], [], []), 0.0)
    threading.Timer(0.3, node.gate.set).start()
    _wait_for(devices, {0, 1})
    assert failed == [] and devices.errors == []
    assert node.calls.index(("park", "r")) < node.calls.index(("restore", "r", (1,)))
    assert node.holders["r"] == (1,)
    assert ("step", [((1,), ["r"])]) in node.calls


class FailingOnce(dict):
    """``NodeEngine.failed`` whose first lookup raises: the job that makes it dies before
    its moves (what a bug or a lost control path would do)."""

    def __init__(self):
        super().__init__()
        self.raised = False

    def __contains__(self, key):
        if not self.raised:
            self.raised = True
            raise RuntimeError("control path lost")
        return super().__contains__(key)


def test_a_job_that_fails_before_its_move_does_not_hold_the_next_one():
    """Job 0 dies before it reaches its park of r; job 1's own park of r must not wait for
    it forever: it runs once job 0 has ended, and only job 0's error is kept."""
    r, x = _req("r"), _req("x")
    node = ParkingNode({"r": (1,), "x": (0,)})
    node.failed = FailingOnce()
    node.gate.set()
    g0, g1 = Node(2).groups(1)
    devices = EngineDevices(node, lambda q: q)
    devices.launch(Job(0, g0, [x], 1, [Move(r, g1, None, "offload")], [], []), 0.0)
    _wait_for(devices, {0})
    devices.launch(Job(1, g1, [], 0, [Move(r, g1, None, "offload")], [], []), 0.0)
    _wait_for(devices, {1})
    assert node.calls == [("park", "r")] and node.parked == {"r"}
    assert len(devices.errors) == 1 and "job 0" in devices.errors[0]


def test_a_failed_park_fails_that_request_alone():
    """Job 0 parks y (held nowhere: the park raises) to make room and steps a: y fails
    alone, a still takes its step, and the job's move seconds keep y's place (0 s)."""
    a, y = _req("a"), _req("y")
    node, devices, failed = _open_devices({"a": (0,)})
    g0, _ = Node(2).groups(1)
    devices.launch(Job(0, g0, [a], 1, [Move(y, g0, None, "offload")], [], []), 0.0)
    done = _wait_for(devices, {0})
    assert failed == ["y"] and len(devices.errors) == 1 and "park of y" in devices.errors[0]
    assert node.calls == [("step", [((0,), ["a"])])]
    assert done[-1].timings.move_s == [0.0]


def test_a_job_that_parks_and_restores_the_same_request_does_not_wait_for_itself():
    """``run_node`` accepts an assignment that parks a paused member of its own batch
    (``Assignment(g0, ["r"], offload=["r"])``): the job moves r twice, a park then a
    restore onto g0. Its second move of r must not be ordered behind its first as if
    another job's (that waits forever)."""
    r = _req("r")
    node = ParkingNode({"r": (0,)})
    node.gate.set()
    g0, g1 = Node(2).groups(1)
    devices = EngineDevices(node, lambda q: q)
    devices.launch(Job(0, g0, [r], 1, [Move(r, g0, None, "offload"),
                                       Move(r, None, g0, "restore")], [], []), 0.0)
    _wait_for(devices, {0}, limit_s=5.0)
    assert devices.errors == []
    assert node.calls == [("park", "r"), ("restore", "r", (0,)), ("step", [((0,), ["r"])])]


def test_a_failed_restore_fails_that_request_alone_and_later_jobs_leave_it_out():
    """Job 0 steps a (held on device 0) and r, restored from the host — but r is not
    parked (its restore raises): r fails alone, a still takes its step. Job 1 again lists
    both (the loop has not dropped r yet): r is left out without a second error, a steps."""
    a, r = _req("a"), _req("r")
    node, devices, failed = _open_devices({"a": (0,)})
    g0, _ = Node(2).groups(1)
    devices.launch(Job(0, g0, [a, r], 1, [Move(r, None, g0, "restore")], [], []), 0.0)
    _wait_for(devices, {0})
    devices.launch(Job(1, g0, [a, r], 1, [], [], []), 0.0)
    _wait_for(devices, {1})
    assert failed == ["r"] and devices.failed == {"r"} and len(devices.errors) == 1
    assert node.calls == [("step", [((0,), ["a"])]), ("step", [((0,), ["a"])])]


def test_a_job_whose_park_of_a_member_fails_does_not_fail_it_again_on_its_restore():
    """A job parks r (a paused member of its own batch) and restores it onto its group;
    the park raises (r is held nowhere): r fails once, its restore is not tried, and the
    job's move seconds keep both places (0 s each)."""
    r = _req("r")
    node, devices, failed = _open_devices({})
    g0, _ = Node(2).groups(1)
    devices.launch(Job(0, g0, [r], 1, [Move(r, g0, None, "offload"),
                                       Move(r, None, g0, "restore")], [], []), 0.0)
    done = _wait_for(devices, {0})
    assert failed == ["r"] and len(devices.errors) == 1
    assert node.calls == [] and done[-1].timings.move_s == [0.0, 0.0]
