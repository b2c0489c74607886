"""``EngineDevices``' decode phase on a scripted stand-in for the ``NodeEngine`` (no
workers): what one request's failure does to the others of its job, and that every decode
runs on the device the loop assigned it (``decode_lanes`` of the job the loop launched),
which is the device the loop frees with it."""

from __future__ import annotations

import numpy as np

from ditmem.parallel.devices import EngineDevices
from ditmem.scheduler import Request
from ditmem.scheduler.node.device import Job
from ditmem.scheduler.node.topology import Node


class ScriptedNode:
    """Records every call; ``move`` raises ``MemoryError`` for the ids in ``no_room``;
    ``failed``: requests already lost (``NodeEngine.failed``)."""

    def __init__(self, no_room=(), failed=None):
        self.no_room = set(no_room)
        self.failed = dict(failed or {})
        self.calls: list[tuple] = []
        self.holders: dict[str, tuple[int, ...]] = {}

    def step(self, plan):
        self.calls.append(("step", plan))

    def move(self, rid, devices):
        self.calls.append(("move", rid, devices))
        if rid in self.no_room:
            raise MemoryError(f"{rid}: no room on {devices}")
        self.holders[rid] = devices

    def decode(self, rid, tile=None):
        self.calls.append(("decode", rid, self.holders.get(rid)))
        return np.zeros((1, 1, 3), np.uint8)

    def release(self, rid):
        self.calls.append(("release", rid))
        self.holders.pop(rid, None)


def _run(node, job):
    failed = []
    devices = EngineDevices(node, lambda r: r, keep_outputs=True,
                            on_failed=lambda rid, exc: failed.append(rid))
    devices.launch(job, 0.0)
    seen = []
    while not any(c.last for c in seen):
        seen += devices.wait(None)
    return devices, seen, failed


def _req(rid):
    return Request(rid, 0.0, width=64, height=64, steps=1)


def test_a_gather_without_room_fails_that_request_only():
    """A degree-2 job finishing a and b (lanes: a -> 0, b -> 1); a's gather onto device 0
    finds no room. a fails (its pages released, device 0 handed back at the steps' end
    with nothing to decode); b is still gathered onto device 1, decoded there and done."""
    a, b = _req("a"), _req("b")
    node = ScriptedNode(no_room={"a"})
    pair = Node(2).groups(2)[0]
    devices, seen, failed = _run(node, Job(0, pair, [a, b], 1, [], [], [a, b]))
    assert failed == ["a"] and devices.failed == {"a"}
    assert set(devices.outputs) == {"b"}
    assert ("decode", "b", (1,)) in node.calls and ("release", "a") in node.calls
    stepped = next(c for c in seen if c.stepped)
    assert stepped.released == (0,) and stepped.decoded == ("a",)
    assert [(c.decoded, c.released) for c in seen if c.decoded and not c.stepped] == [
        (("b",), (1,))]


def test_a_member_lost_while_paused_leaves_the_others_on_their_loop_lanes():
    """The loop launched a job finishing a and b on devices 0-1 (lanes a -> 0, b -> 1);
    a was lost with a device while paused, so the engine leaves it out. b still decodes
    on device 1, the device the loop frees with it; device 0 (no decode left) goes back at
    the steps' end."""
    a, b = _req("a"), _req("b")
    node = ScriptedNode(failed={"a": "device 3 lost"})
    pair = Node(2).groups(2)[0]
    devices, seen, failed = _run(node, Job(0, pair, [a, b], 1, [], [], [a, b]))
    assert failed == ["a"]
    assert ("move", "b", (1,)) in node.calls and ("decode", "b", (1,)) in node.calls
    stepped = next(c for c in seen if c.stepped)
    assert stepped.released == (0,)
    assert [(c.decoded, c.released) for c in seen if c.decoded and not c.stepped] == [
        (("b",), (1,))]
