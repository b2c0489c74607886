"""The node demo's in-run accuracy check (``TrackedDevices``) over ``EngineDevices`` on a
scripted stand-in for the ``NodeEngine`` whose every command advances a fake clock by
exactly what the profile prices it: each job is counted once and every kind comes out at
x1.00 of the profile. A job now hands its devices and decodes back in several events
(partial ``Completion``s sharing the job's ``Timings``); counting each event as a job
priced a job's decodes once per event while its measured decode (written after the last
decode) was seen once or twice — the two-device demo's "decodes x0.47-0.49 over 450 jobs"
for 150 requests."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from ditmem.parallel.devices import EngineDevices
from ditmem.scheduler import Request
from ditmem.scheduler.cost import CostModel
from ditmem.scheduler.node.cost import NodeCost
from ditmem.scheduler.node.device import Job
from ditmem.scheduler.node.topology import Node
from ditmem.tools.node_demo import TrackedDevices

PROFILE = Path(__file__).parents[2] / "benchmarks/parallel/results/demo_devices2_run4_profile.json"
MODEL = "qwen-image"


class FakeClock:
    def __init__(self):
        self.t = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.t

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.t += seconds


class PricedNode:
    """Each command takes (on ``clock``) what ``truth`` prices it; moves take nothing."""

    def __init__(self, truth: NodeCost, clock: FakeClock, requests: dict[str, Request]):
        self.truth, self.clock, self.requests = truth, clock, requests
        self.failed: dict[str, str] = {}
        self.decodes: list[tuple[str, tuple[int, int] | None]] = []

    def encode(self, generation, device):
        self.clock.advance(self.truth.cost.encode_time(generation))
        return True

    def move(self, rid, devices):
        pass

    def step(self, plan):
        ((group, rids),) = plan
        tokens = [self.truth.cost.tokens(self.requests[r]) for r in rids]
        self.clock.advance(self.truth.step_time(MODEL, tokens, len(group)))

    def decode(self, rid, tile=None):
        self.decodes.append((rid, tile))
        self.clock.advance(self.truth.cost.decode_time(self.requests[rid]))
        return np.zeros((1, 1, 3), np.uint8)

    def release(self, rid):
        pass


def _truth() -> NodeCost:
    return NodeCost(CostModel.from_dict(json.loads(PROFILE.read_text())))


def test_each_job_is_counted_once_and_a_priced_run_reads_x1():
    """Two jobs: a 1024² request encoded, stepped 3 times and decoded (tiled) on device 0;
    a 512² request stepped twice at degree 2 and decoded on device 0 (device 1 handed back
    at the steps' end). Every kind: 2 jobs at most, measured = predicted."""
    truth = _truth()
    assert truth.cost.profile["models"][MODEL]["decode_tile_px"] == 256
    big = Request("big", 0.0, MODEL, width=1024, height=1024, steps=3)
    mid = Request("mid", 0.0, MODEL, width=512, height=512, steps=2)
    clock = FakeClock()
    node = PricedNode(truth, clock, {"big": big, "mid": mid})
    engine = EngineDevices(node, lambda r: r, decode_tile=(256, 224), clock=clock)
    tracked = TrackedDevices(engine, truth)
    topo = Node(2, truth.links)
    single, pair = topo.groups(1)[0], topo.groups(2)[0]
    events = []
    for job in (Job(0, single, [big], 3, [], [big], [big]), Job(1, pair, [mid], 2, [], [], [mid])):
        tracked.launch(job, clock())
        seen = []
        while not any(c.last for c in seen):
            seen += tracked.wait(None)
        events.append(len(seen))
    assert events[0] >= 3 and events[1] >= 3  # stepped, decoded, last: partial events
    assert node.decodes == [("big", (256, 224)), ("mid", (256, 224))]
    out = tracked.summary()
    assert set(out) == {"encodes", "steps d1", "steps d2", "decodes"}
    assert out["decodes"]["jobs"] == 2
    priced = truth.cost.decode_time(big) + truth.cost.decode_time(mid)
    assert out["decodes"]["predicted_s"] == pytest.approx(priced)
    # 1024²: 25 tiles, 20.25 full tiles' pixels; 512²: 9 tiles, 5.0625
    tile_s = truth.cost.profile["models"][MODEL]["decode_tile_s"]
    assert priced == pytest.approx((20.25 + 5.0625) * tile_s)
    for kind in ("encodes", "steps d1", "steps d2", "decodes"):
        assert out[kind]["ratio"] == pytest.approx(1.0), kind
    assert out["encodes"]["jobs"] == out["steps d1"]["jobs"] == out["steps d2"]["jobs"] == 1


def test_tracked_devices_pass_a_take_back_through():
    """The demo runs ``slo`` (split decodes that yield: on by default) on ``TrackedDevices``:
    a spare taken back by the loop reaches the devices (``NodeDevices.reclaim``), the run
    is the bare devices' one, where the 256² ends sooner than with split alone."""
    from node_cases import take_back_run

    bare = take_back_run(lambda d: d, split_yield=True)
    assert bare["small"] < take_back_run(lambda d: d, split_yield=False)["small"] - 1e-3
    assert take_back_run(lambda d: TrackedDevices(d, _truth()), split_yield=True) == bare
