"""The node engine hands a job's devices back one by one (``EngineDevices`` on 2 gloo
workers): after a degree-2 job's last step the device without a decode is free at once and
takes a new job while the other still decodes; each request is done as its own decode
ends. Images equal the uninterrupted single-device runs; no page is left anywhere.

Ordering is checked by events (completions and the workers' stage events), not by
timing thresholds."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from node_cases import pages as _pages
from node_cases import tiny_node

from ditmem.parallel.devices import EngineDevices
from ditmem.scheduler import Request
from ditmem.scheduler.node.device import Job
from ditmem.scheduler.node.topology import Node
from ditmem.tools.replay import to_generation

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 2


@pytest.fixture(scope="module")
def node():  # this module's own engine
    yield from tiny_node(pool_pages=512, host_pages=64)


def _alone(node, r: Request) -> np.ndarray:
    """``r`` encoded, stepped and decoded on device 0 alone (the reference)."""
    g = to_generation(r)
    g.request_id = "ref-" + r.id
    assert node.encode(g, 0)
    for _ in range(r.steps):
        node.step([((0,), [g.request_id])])
    image = node.decode(g.request_id)
    node.release(g.request_id)
    return image


def _close(a: np.ndarray, b: np.ndarray) -> None:
    """Within 1 uint8 level: a degree-2 step is the same arithmetic on token shards (bit
    equal on this CPU); a last-bit latent difference may move a decoded pixel by one."""
    assert a.shape == b.shape
    assert np.abs(a.astype(int) - b.astype(int)).max() <= 1


def test_the_free_device_takes_a_new_job_while_the_other_decodes(node):
    """Job 0: a 256² (decoded whole: the long decode) and nothing else at degree 2 on
    devices 0-1. Its first completion is its steps' end with device 1 handed back (device
    0 decodes); job 1 (a 64², encode + steps + decode) is launched on device 1 then, and
    its encode starts before job 0's decode has ended; job 0's request is done in a later
    completion that hands device 0 back."""
    big = Request("big", 0.0, width=256, height=256, steps=STEPS, seed=1)
    small = Request("small", 0.0, width=64, height=64, steps=STEPS, seed=2)
    expected = {r.id: _alone(node, r) for r in (big, small)}
    topo = Node(2)
    pair, (_, d1) = topo.groups(2)[0], topo.groups(1)
    marks: list[tuple[str, str, float, float]] = []  # (kind, id, start, end) per stage
    lock = threading.Lock()

    def on_event(kind, rids, seconds):
        end = time.monotonic()
        with lock:
            marks.extend((kind, rid, end - seconds, end) for rid in rids)

    devices = EngineDevices(node, to_generation, keep_outputs=True, on_event=on_event)
    devices.launch(Job(0, pair, [big], STEPS, [], [big], [big]), 0.0)
    first = devices.wait(None)[0]
    assert first.job.job_id == 0 and first.stepped and not first.last
    assert first.released == (1,) and first.decoded == ()
    devices.launch(Job(1, d1, [small], STEPS, [], [small], [small]), devices.now())
    seen = [first]
    while sum(c.last for c in seen) < 2:
        seen += devices.wait(None)
    assert not devices.errors, devices.errors
    order = [(c.job.job_id, c.released, c.decoded, c.last) for c in seen]
    big_done = order.index((0, (0,), ("big",), False))
    assert order.index((0, (), (), True)) > big_done  # the job's end after its decode
    assert (1, (1,), ("small",), False) in order
    stage = {(k, rid): (s, e) for k, rid, s, e in marks}
    assert stage[("encoded", "small")][0] < stage[("decoded", "big")][1]
    assert stage[("stepped", "big")][1] <= stage[("encoded", "small")][0]
    for rid in ("big", "small"):
        _close(devices.outputs[rid], expected[rid])
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}


def test_two_decodes_of_a_degree_two_job_each_done_at_its_own_end(node):
    """A degree-2 job of two requests finishing together: each is gathered onto its own
    device and decoded there at once; each comes back in its own completion with its
    device; images equal the single-device runs, nothing left."""
    a = Request("a", 0.0, width=64, height=64, steps=STEPS, seed=3)
    b = Request("b", 0.0, width=128, height=64, steps=STEPS, seed=4)
    expected = {r.id: _alone(node, r) for r in (a, b)}
    pair = Node(2).groups(2)[0]
    devices = EngineDevices(node, to_generation, keep_outputs=True)
    devices.launch(Job(0, pair, [a, b], STEPS, [], [a, b], [a, b]), 0.0)
    seen = []
    while not any(c.last for c in seen):
        seen += devices.wait(None)
    assert not devices.errors, devices.errors
    assert seen[0].stepped and seen[0].released == ()  # both devices decode
    done = {c.decoded: c.released for c in seen if c.decoded}
    assert done == {("a",): (0,), ("b",): (1,)}
    for r in (a, b):
        _close(devices.outputs[r.id], expected[r.id])
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}


def test_a_failed_decode_fails_only_its_request_not_the_paused_member(node):
    """A degree-2 job stepping x (its last step) and y (one more to go); x's decode fails
    (a tile whose stride exceeds it: the worker refuses it). Only x fails; y, paused at the
    steps' end and the loop's again, is not failed and still held on both devices."""
    x = Request("x", 0.0, width=128, height=128, steps=1, seed=5)
    y = Request("y", 0.0, width=64, height=64, steps=2, seed=6)
    pair = Node(2).groups(2)[0]
    failed = []
    devices = EngineDevices(node, to_generation, decode_tile=(64, 100),
                            on_failed=lambda rid, exc: failed.append(rid))
    devices.launch(Job(0, pair, [x, y], 1, [], [x, y], [x]), 0.0)
    seen = []
    while not any(c.last for c in seen):
        seen += devices.wait(None)
    assert seen[0].stepped and seen[0].released == (1,)
    assert failed == ["x"] and devices.failed == {"x"}
    assert node.holders["y"] == (0, 1)
    node.release("y")
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}


def test_a_restore_from_the_host_waits_for_no_other_device(node):
    """r is parked from device 0 and restored onto device 1 while device 0 is still busy
    with queued steps of another request (sent without waiting, as another job's thread
    does). The restore returns before device 0 is done — its host copy there is freed
    after, in device 0's order (a real two-device demo stalled 3 s on it, session 11) —
    and nothing is left behind once device 0's work ends."""
    from ditmem.parallel import commands as cmd

    busy = Request("busy", 0.0, width=256, height=256, steps=40, seed=3)
    r = Request("r", 0.0, width=64, height=64, steps=STEPS, seed=4)
    before = _pages(node)
    for q in (busy, r):
        assert node.encode(to_generation(q), 0)
    node.park("r")
    queued = [node.submit({0: cmd.Step(["busy"], (0,))})[0] for _ in range(40)]
    assert node.restore("r", (1,)) is not None
    assert not queued[-1].done()  # device 0 still runs its steps
    for f in queued:
        assert f.result(timeout=120).ok
    assert node.holders["r"] == (1,)
    node.step([((1,), ["r"])])
    for rid in ("busy", "r"):
        node.release(rid)
    assert _pages(node) == before


def test_a_restored_requests_peak_does_not_count_the_host_copy_its_old_device_still_frees(node):
    """As above (device 0 busy, r restored onto device 1), then r steps on device 1 while
    device 0 still runs: r's peak is its pages on one device (as after its first step on
    device 0), not those plus the host copy device 0 has not freed yet — a peak that
    depends on how long another job keeps the old device busy."""
    from ditmem.parallel import commands as cmd

    busy = Request("busy2", 0.0, width=256, height=256, steps=40, seed=3)
    r = Request("r2", 0.0, width=64, height=64, steps=STEPS, seed=4)
    before = _pages(node)
    for q in (busy, r):
        assert node.encode(to_generation(q), 0)
    node.step([((0,), ["r2"])])
    alone = node.peak_pages("r2")
    assert alone > 0
    node.park("r2")
    queued = [node.submit({0: cmd.Step(["busy2"], (0,))})[0] for _ in range(40)]
    assert node.restore("r2", (1,)) is not None
    node.step([((1,), ["r2"])])
    assert not queued[-1].done()  # device 0 has not freed r2's host copy yet
    assert node.peak_pages("r2") == alone
    for f in queued:
        assert f.result(timeout=120).ok
    for rid in ("busy2", "r2"):
        node.release(rid)
    assert _pages(node) == before
