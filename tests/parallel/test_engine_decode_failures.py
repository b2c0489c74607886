"""``EngineDevices``' decode phase on a scripted stand-in for the ``NodeEngine`` (no
workers): what one request's failure does to the others of its job, and that every decode
runs on the device the loop assigned it (``decode_lanes`` of the job the loop launched),
which is the device the loop frees with it."""

from __future__ import annotations

import threading

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
        self.dead: dict[int, str] = {}  # devices lost (``NodeEngine.dead``)
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


def _run(node, job, tile=None, reclaim=()):
    """``job`` on ``EngineDevices`` over ``node`` (``tile``: their decode tile geometry)
    until its last event: (the devices, every event, the ids failed). ``reclaim``: spare
    devices the loop takes back once the job is launched, before its steps (which wait
    for ``node.gate`` where the node has one)."""
    failed = []
    devices = EngineDevices(node, lambda r: r, keep_outputs=True, decode_tile=tile,
                            on_failed=lambda rid, exc: failed.append(rid))
    devices.launch(job, 0.0)
    for d in reclaim:
        devices.reclaim(job, d, 0.0)
    if getattr(node, "gate", None) is not None:
        node.gate.set()
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


class SplittingNode(ScriptedNode):
    """A ScriptedNode whose split decodes are recorded too; ``broken``: ids whose split
    decode fails after their tiles (a worker's error in the blend)."""

    def __init__(self, broken=(), **kw):
        super().__init__(**kw)
        self.broken = set(broken)

    def decode_split(self, rid, devices, tile, on_tiles=None, taken=None):
        self.calls.append(("split", rid, tuple(devices), tile))
        if on_tiles is not None:
            for d in devices[1:]:  # each other device as its tiles end
                on_tiles((d,))
        if rid in self.broken:
            raise RuntimeError(f"blend of {rid} failed")
        return np.zeros((1, 1, 3), np.uint8)


def _run_split(node, job):
    return _run(node, job, tile=(64, 48))


def test_split_decodes_each_on_its_devices_and_a_failed_one_fails_alone():
    """A degree-4 job finishing a (128² : 3 × 3 tiles of 64/48) and b (also 128²) with
    split decodes: a on devices (0, 2), b on (1, 3) (``decode_devices``), each gathered
    onto its lane first. a's blend fails: a fails alone (released), its devices handed
    back; b is decoded and done, device 3 handed back with its tiles, device 1 with b."""
    a, b = (Request(r, 0.0, width=128, height=128, steps=1) for r in ("a", "b"))
    node = SplittingNode(broken={"a"})
    quad = Node(4).groups(4)[0]
    job = Job(0, quad, [a, b], 1, [], [], [a, b], split_decodes=True)
    devices, seen, failed = _run_split(node, job)
    assert failed == ["a"] and set(devices.outputs) == {"b"}
    assert ("move", "a", (0,)) in node.calls and ("move", "b", (1,)) in node.calls
    assert ("split", "a", (0, 2), (64, 48)) in node.calls
    assert ("split", "b", (1, 3), (64, 48)) in node.calls
    assert ("release", "a") in node.calls and ("release", "b") in node.calls
    stepped = next(c for c in seen if c.stepped)
    assert stepped.released == () and stepped.decoded == ()
    released = sorted(d for c in seen if not c.stepped for d in c.released)
    assert released == [0, 1, 2, 3]
    assert sorted(rid for c in seen for rid in c.decoded) == ["a", "b"]
    assert ((), (3,)) in [(c.decoded, c.released) for c in seen]


def test_a_split_decode_of_one_tile_runs_on_its_lane_and_frees_the_spare_at_once():
    """A 64² (one 64-px tile) finished by a degree-2 job with split decodes: decoded whole
    on device 0 (its lane); device 1 has no work and goes back at the steps' end."""
    a = _req("a")
    node = SplittingNode()
    pair = Node(2).groups(2)[0]
    devices, seen, failed = _run_split(node, Job(0, pair, [a], 1, [], [], [a],
                                                 split_decodes=True))
    assert not failed and set(devices.outputs) == {"a"}
    assert ("decode", "a", (0,)) in node.calls
    assert not any(c[0] == "split" for c in node.calls)
    stepped = next(c for c in seen if c.stepped)
    assert stepped.released == (1,)


class YieldingNode(SplittingNode):
    """A SplittingNode whose split decodes ask ``taken`` for each other device (as the real
    one does before that device's second tile) and record the answers."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.asked = {}
        self.gate = threading.Event()  # steps wait for it (the loop's reclaim comes first)

    def step(self, plan):
        assert self.gate.wait(60)
        super().step(plan)

    def decode_split(self, rid, devices, tile, on_tiles=None, taken=None):
        self.asked[rid] = {d: taken(d) for d in devices[1:]}
        return super().decode_split(rid, devices, tile, on_tiles, taken)


def test_a_reclaimed_spare_is_seen_by_its_decode_and_its_decode_is_not_learned_from():
    """The degree-4 job of a and b (split over (0, 2) and (1, 3)); the loop takes device 3
    back: b's split decode is told so (device 2 of a's is not), and the job's measured
    decodes (``Timings.decodes``, what the policy learns from) hold a's alone, over 2
    devices."""
    a, b = (Request(r, 0.0, width=128, height=128, steps=1) for r in ("a", "b"))
    node = YieldingNode()
    quad = Node(4).groups(4)[0]
    job = Job(0, quad, [a, b], 1, [], [], [a, b], split_decodes=True)
    devices, seen, failed = _run(node, job, tile=(64, 48), reclaim=(3,))
    assert not failed and set(devices.outputs) == {"a", "b"}
    assert node.asked == {"a": {2: False}, "b": {3: True}}
    last = next(c for c in seen if c.last)
    assert [(rid, n) for rid, n, _ in last.timings.decodes] == [("a", 2)]
    assert devices._taken == {}  # forgotten with the job


def test_a_reclaim_after_its_job_ended_is_dropped():
    """The loop's view lags the devices: it may take a spare back whose job has already
    ended (the spare's event still queued). Nothing of it is kept: a later job of the same
    id on the same devices (a second run) splits with no spare taken."""
    a = Request("a", 0.0, width=128, height=128, steps=1)
    node = YieldingNode()
    node.gate.set()
    pair = Node(2).groups(2)[0]
    job = Job(0, pair, [a], 1, [], [], [a], split_decodes=True)
    devices, _, failed = _run(node, job, tile=(64, 48))
    devices.reclaim(job, 1, devices.now())
    assert devices._taken == {}
    devices.launch(job, devices.now())
    seen = []
    while not any(c.last for c in seen):
        seen += devices.wait(None)
    assert not failed and node.asked == {"a": {1: False}}
    assert [(rid, n) for rid, n, _ in next(c for c in seen if c.last).timings.decodes] == [
        ("a", 2)]


def test_a_reclaim_too_late_to_move_a_tile_leaves_the_decode_learned_from():
    """The loop takes device 1 back when its tiles are already in their last one (the
    split decode never answers ``taken`` True: nothing moves to the lane): the decode ran
    as split, whole, and is learned from — as on the simulator's devices, where such a
    take-back changes no end (``VirtualDevices.reclaim``)."""
    a = Request("a", 0.0, width=128, height=128, steps=1)
    node = SplittingNode()  # asks ``taken`` nothing: every spare tile ran where it was
    node.gate = threading.Event()
    node.step = lambda plan, step=node.step: (node.gate.wait(60), step(plan))
    pair = Node(2).groups(2)[0]
    job = Job(0, pair, [a], 1, [], [], [a], split_decodes=True)
    devices, seen, _ = _run(node, job, tile=(64, 48), reclaim=(1,))
    assert set(devices.outputs) == {"a"}
    assert [(rid, n) for rid, n, _ in next(c for c in seen if c.last).timings.decodes] == [
        ("a", 2)]


def test_a_split_decode_that_lost_a_spare_is_not_learned_from():
    """A spare dies during the split (``NodeEngine.decode_split`` runs its tiles on the
    holder and the image comes): the decode is not a split's time, so it is left out of
    the decode learning."""
    a = Request("a", 0.0, width=128, height=128, steps=1)

    class LosingNode(SplittingNode):
        def decode_split(self, rid, devices, tile, on_tiles=None, taken=None):
            self.dead[devices[1]] = "killed"
            return np.zeros((1, 1, 3), np.uint8)

    node = LosingNode()
    pair = Node(2).groups(2)[0]
    devices, seen, failed = _run(node, Job(0, pair, [a], 1, [], [], [a], split_decodes=True),
                                 tile=(64, 48))
    assert not failed and set(devices.outputs) == {"a"}
    assert next(c for c in seen if c.last).timings.decodes == []
