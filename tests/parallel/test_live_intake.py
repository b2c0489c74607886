"""The live intake of the node loop and the move timing split, without device workers:
the intake's rules, the scheduler's node loop driven through it (virtual devices), and
``MoveTiming`` on hand-made numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ditmem.scheduler as sched
from ditmem.parallel.intake import IntakeClosed, LiveIntake, feed_trace
from ditmem.parallel.node import MoveTiming
from ditmem.scheduler.cost import CostModel
from ditmem.scheduler.node.cost import NodeCost
from ditmem.scheduler.node.device import VirtualDevices
from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.simulator import run_node
from ditmem.scheduler.node.topology import Node
from ditmem.scheduler.request import Request


def _cost() -> CostModel:
    data = json.loads((Path(sched.__file__).parent / "profiles" / "cpu-tiny.json").read_text())
    data["parallel"] = {"qwen-image": {"tokens": [16, 4096], "source": "test",
                                       "speedup": {"1": [1.0, 1.0], "2": [1.2, 1.8]}}}
    data["links"] = {"device_bytes_per_s": 1e9, "host_bytes_per_s": 5e9, "source": "test"}
    return CostModel.from_dict(data)


def _req(cost, rid: str, arrival: float = 0.0, side: int = 256, steps: int = 4) -> Request:
    r = Request(rid, arrival, "qwen-image", width=side, height=side, steps=steps)
    cost.assign_deadline(r, 3.0)
    return r


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_intake_rules():
    cost, wakes = _cost(), []
    intake = LiveIntake("qwen-image", _Clock(), lambda: wakes.append(1))
    b, a = _req(cost, "b", 0.2), _req(cost, "a", 0.1)
    intake.push(b)
    intake.push(a)
    assert len(wakes) == 2
    assert intake.cancel("b") is True          # never reached the loop
    assert intake.take(0.0) == [a] and intake.take(0.0) == []
    assert intake.cancel("a") is False         # the loop has it: it is told
    assert intake.cancelled() == ["a"] and intake.cancelled() == []
    with pytest.raises(ValueError, match="no deadline"):
        intake.push(Request("x", 0.0, "qwen-image"))
    with pytest.raises(ValueError, match="serves 'qwen-image'"):
        intake.push(Request("w", 0.0, "wan2.2-a14b", deadline=1.0))
    intake.push(_req(cost, "c"))
    intake.close()
    assert not intake.closed()                  # "c" is still to be taken
    with pytest.raises(IntakeClosed):
        intake.push(_req(cost, "d"))
    intake.take(0.0)
    assert intake.closed() and intake.next_arrival() is None
    intake.mark_lost(1)
    assert intake.lost() == 0b10


def test_node_loop_through_the_live_intake_drops_a_cancelled_request():
    """Three requests given to the loop through a live intake on virtual devices; "b" is
    cancelled once it has started (between two of its jobs): the loop lets it go (told as
    started: it held pages) and never runs it again; the others finish; the policy keeps
    nothing about any of them afterwards (a cancelled request's entries used to stay)."""
    cost = _cost()
    truth = NodeCost(cost)
    topo = Node(2, truth.links)
    policy = make_node_policy("slo", NodeCost(cost), topo)
    dropped = []
    intake = LiveIntake("qwen-image", _Clock(), lambda: None,
                        on_dropped=lambda rid, started: dropped.append((rid, started)))
    for rid in ("a", "b", "c"):
        intake.push(_req(cost, rid, steps=6))
    devices = VirtualDevices(truth)
    launched = []

    class Cancelling:
        """Cancels "b" right after its first job is launched."""

        def launch(self, job, now):
            launched.append([r.id for r in job.batch])
            devices.launch(job, now)
            if "b" in launched[-1] and not dropped:
                intake.cancel("b")

        def wait(self, until):
            done = devices.wait(until)
            if not done and not intake.closed():
                intake.close()
            return done

    result = run_node(intake, policy, Cancelling(), topo, truth)
    finished = sorted(r.request.id for r in result.records)
    assert finished == ["a", "c"]
    assert dropped == [("b", True)]
    runs_of_b = [batch for batch in launched if "b" in batch]
    assert len(runs_of_b) == 1                  # never run after the cancel
    assert policy._static == {} and policy.promise.shadow._entries == {}


def test_feed_trace_pushes_at_arrival_times_then_closes():
    cost, clock = _cost(), _Clock()
    intake = LiveIntake("qwen-image", clock, lambda: None)
    trace = [_req(cost, "late", 0.3), _req(cost, "early", 0.0)]
    clock.t = 1.0  # both are due: pushed at once, in arrival order
    feed_trace(intake, trace).join(5)
    assert [r.id for r in intake.take(1.0)] == ["early", "late"]
    assert intake.closed()


def test_move_timing_split():
    """Device 0 began 2 ms after the send, device 1 (busy) 50 ms after; device 1's own
    command took 4 ms; the replies were all back at 55 ms."""
    t = MoveTiming(0.055, {0: 0.052, 1: 0.004}, {0: 0.002, 1: 0.050})
    assert t.wait_s == pytest.approx(0.050)
    assert t.copy_s == pytest.approx(0.004)
    assert t.own_s == pytest.approx(0.005)
    assert t.parts() == pytest.approx({"wait": 0.050, "copy": 0.004, "control": 0.001})
    assert MoveTiming(0.003).parts() == pytest.approx({"wait": 0, "copy": 0.003, "control": 0})


def test_the_loop_counts_the_pages_the_workers_have():
    """The profile was measured with another pool: the service sets its cost model's
    device pages per device and host pages (all devices' host pools) to the node's."""
    from types import SimpleNamespace

    from ditmem.parallel.serving import _fit_pools

    cost = _cost()
    node = SimpleNamespace(page_bytes=1 << 14, pool_pages=100, host_pages=50, num_devices=2)
    assert cost.device_pages("qwen-image", 1 << 14) != 100
    _fit_pools(cost, node, "qwen-image")
    assert cost.device_pages("qwen-image", 1 << 14) == 100
    assert cost.host_pages(1 << 14) == 100
