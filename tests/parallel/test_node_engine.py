"""The node engine on 2 CPU devices (worker processes, gloo): degree changes between
steps, migration through host pages, page accounting, and a killed worker."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from node_cases import pages as _pages
from node_cases import tiny_node

from ditmem.models.common.request import GenerationRequest
from ditmem.parallel.node import DeviceLost, NodeEngine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 5


def _request(rid: str, seed: int, width: int, height: int, cfg: bool) -> GenerationRequest:
    return GenerationRequest(
        "a red cat on a mat" if cfg else "a lighthouse", width=width, height=height,
        num_inference_steps=STEPS, negative_prompt="blurry" if cfg else None,
        guidance_scale=4.0 if cfg else 1.0, seed=seed, request_id=rid)


@pytest.fixture(scope="module")
def node():  # this module's own engine
    yield from tiny_node()


def test_preempted_at_degree_two_resumed_at_degree_one_on_other_device(node):
    """Tolerance: images equal to within 1 uint8 level. The degree-2 step computes every
    token's rows in GEMMs of other row counts and attention per head on another process;
    each op is the same arithmetic, so latents agree to fp32 rounding at worst (on this CPU
    they come out bit-identical; other BLAS or GPU kernels may round a shard differently),
    and a latent differing in the last bits can move a decoded pixel by one level."""
    a = _request("a", 7, 80, 48, cfg=True)     # 15 image tokens: uneven shards
    b = _request("b", 3, 64, 64, cfg=False)
    refs = {r.request_id: _request("ref-" + r.request_id, r.seed, r.width, r.height,
                                   r.negative_prompt is not None) for r in (a, b)}
    assert node.encode(a, 0) and node.encode(b, 0)
    for ref in refs.values():
        assert node.encode(ref, 0)
    # uninterrupted single-device references on device 0
    for _ in range(STEPS):
        node.step([((0,), ["ref-a", "ref-b"])])
    expected = {rid: node.decode(ref.request_id) for rid, ref in refs.items()}
    for ref in refs.values():
        node.release(ref.request_id)

    node.step([((0,), ["a", "b"])])                      # step 1 at degree 1 on device 0
    node.move("a", (0, 1))                               # re-shard over the device link
    node.move("b", (0, 1))
    (result,) = node.step([((0, 1), ["a", "b"])])        # steps 2-3 at degree 2, packed
    node.step([((0, 1), ["a", "b"])])
    assert set(result.device_pages) == {0, 1}
    node.park("a")                                       # preempted at degree 2
    node.park("b")
    pages = _pages(node)
    assert pages[0][0] == 0 and pages[1][0] == 0          # nothing left on the devices
    assert pages[0][1] > 0 and pages[1][1] > 0            # both shards in host pages
    assert node.resume("a", (1,))                        # the other device, degree 1
    assert node.resume("b", (0,))
    stats = node.stats()
    assert stats[1].held == ["a"] and stats[0].held == ["b"]
    assert stats[0].host_pages == 0 and stats[1].host_pages == 0  # host copies dropped
    for _ in range(STEPS - 3):                           # both devices at once
        node.step([((1,), ["a"]), ((0,), ["b"])])
    for rid in ("a", "b"):
        image = node.decode(rid)
        assert image.shape == expected[rid].shape
        diff = np.abs(image.astype(int) - expected[rid].astype(int)).max()
        assert diff <= 1, f"{rid}: image differs by {diff} levels"
        node.release(rid)
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}        # no page leaks on any device


def test_degree_one_to_two_and_back_on_device_link_frees_old_parts(node):
    r = _request("c", 5, 64, 48, cfg=True)
    assert node.encode(r, 1)
    before = _pages(node)[1][0]
    node.move("c", (0, 1))
    sharded = _pages(node)
    assert sharded[0][0] > 0 and sharded[1][0] > 0
    node.step([((0, 1), ["c"])])
    node.move("c", (0,))
    after = _pages(node)
    assert after[1][0] == 0 and after[0][0] == before    # same state size, other device
    with pytest.raises(ValueError, match="held on"):
        node.step([((1,), ["c"])])
    with pytest.raises(ValueError, match="aligned"):
        node.move("c", (1, 0, 2))
    node.release("c")
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}


def test_killed_worker_fails_only_its_requests():
    with NodeEngine("tiny-qwen-image", num_devices=2, pool_pages=128, page_bytes=1 << 14,
                    host_pages=64, start_timeout_s=300, command_timeout_s=120) as node:
        keep, lose = _request("keep", 1, 64, 32, cfg=False), _request("lose", 2, 64, 32, False)
        assert node.encode(keep, 0) and node.encode(lose, 1)
        node.step([((0,), ["keep"]), ((1,), ["lose"])])
        os.kill(node.pids[1], signal.SIGKILL)
        with pytest.raises(DeviceLost, match="device 1"):
            node.step([((1,), ["lose"])])
        assert "device 1" in node.failed["lose"] and "keep" not in node.failed
        with pytest.raises(DeviceLost, match="lose failed"):
            node.decode("lose")
        for _ in range(STEPS - 1):
            node.step([((0,), ["keep"])])                 # device 0 keeps serving
        image = node.decode("keep")
        assert image.shape == (32, 64, 3)
        node.release("keep")
        assert set(node.stats()) == {0}
        assert node.stats()[0].device_pages == 0


def test_speedup_measurement_rows_on_the_node(node):
    from ditmem.parallel.speedup import measure_speedups, speedup_table

    rows = measure_speedups(node, [64, 128], 1)
    assert [(r["tokens"], r["degree"]) for r in rows] == [(16, 1), (16, 2), (64, 1), (64, 2)]
    assert all(r["step_ms"] > 0 and r["cpu_ms"] > 0 for r in rows)
    assert all(r["speedup"] == 1.0 for r in rows if r["degree"] == 1)
    table = speedup_table(rows, "test")
    assert table["tokens"] == [16, 64] and len(table["speedup"]["2"]) == 2
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}       # the measuring request is released


def _node_cost():
    import json
    from pathlib import Path

    import ditmem.scheduler as sched
    from ditmem.scheduler.cost import CostModel
    from ditmem.scheduler.node.cost import NodeCost

    path = Path(sched.__file__).parent / "profiles" / "cpu-tiny.json"
    data = json.loads(path.read_text())
    data["parallel"] = {"qwen-image": {"tokens": [16, 4096], "source": "test",
                                       "speedup": {"1": [1.0, 1.0], "2": [1.2, 1.8]}}}
    data["links"] = {"device_bytes_per_s": 1e9, "host_bytes_per_s": 5e9, "source": "test"}
    cost = CostModel.from_dict(data)
    return cost, NodeCost


def test_scheduler_node_loop_runs_on_real_devices(node):
    """The scheduler's own node loop (run_node) drives the workers through EngineDevices:
    every request finishes once (images > 64 px decode in 64-px tiles), with the same
    image under both policies."""
    from ditmem.parallel.devices import EngineDevices
    from ditmem.scheduler import Request
    from ditmem.scheduler.node.policies import make_node_policy
    from ditmem.scheduler.node.simulator import run_node
    from ditmem.scheduler.node.topology import Node
    from ditmem.tools.replay import to_generation

    cost, node_cost = _node_cost()
    shapes = [(64, 64), (128, 64), (64, 96), (128, 128), (64, 64)]
    outputs = {}
    for policy in ("fifo", "slo"):
        requests = [Request(f"q{i}", arrival=0.05 * i, width=w, height=h, steps=3, seed=i,
                            priority=i % 3) for i, (w, h) in enumerate(shapes)]
        truth = node_cost(cost)
        topo = Node(2, truth.links)
        devices = EngineDevices(node, to_generation, keep_outputs=True, decode_tile=(64, 48))
        result = run_node(requests, make_node_policy(policy, node_cost(cost), topo), devices,
                          topo, truth)
        assert not devices.errors, devices.errors
        assert sorted(r.request.id for r in result.records) == [f"q{i}" for i in range(5)]
        assert all(sum(r.degrees.values()) == 3 for r in result.records)
        outputs[policy] = devices.outputs
        assert _pages(node) == {0: (0, 0), 1: (0, 0)}
    for rid, image in outputs["fifo"].items():
        w, h = shapes[int(rid[1:])]
        assert image.shape == (h, w, 3)
        assert np.abs(image.astype(int) - outputs["slo"][rid].astype(int)).max() <= 1


def test_wan_request_preempted_at_degree_two_resumed_at_degree_one_on_other_device():
    """A Wan video (CFG, UniPC history, cross-attention K/V pages with their row layout)
    moves over the device link at degree 1, is re-sharded to degree 2 (latents and solver
    history as token rows), steps there, is parked from both devices into host pages and
    resumed at degree 1 on device 1, parked again and resumed at degree 2, and ends with
    the video an uninterrupted run on one device gives (tolerance: 1 uint8 level, as for
    Qwen-Image above; on this CPU the degree-2 steps are bit-identical,
    tests/parallel/test_sp_step.py)."""

    def video(rid):
        return GenerationRequest("a cat on a boat", width=64, height=48, num_frames=5,
                                 num_inference_steps=6, guidance_scale=5.0,
                                 negative_prompt="ugly", seed=3, request_id=rid)

    with NodeEngine("tiny-wan", num_devices=2, pool_pages=512, page_bytes=1 << 14,
                    host_pages=512, start_timeout_s=300, command_timeout_s=120) as node:
        assert node.encode(video("ref"), 0) and node.encode(video("w"), 0)
        for _ in range(6):
            node.step([((0,), ["ref"])])
        expected = node.decode("ref")
        node.release("ref")
        node.step([((0,), ["w"])])
        node.move("w", (1,))                                  # device link, degree 1
        node.step([((1,), ["w"])])
        node.move("w", (0, 1))                                # re-shard to degree 2
        node.step([((0, 1), ["w"])])
        node.step([((0, 1), ["w"])])
        node.park("w")                                        # both shards to host pages
        assert _pages(node)[0][0] == _pages(node)[1][0] == 0
        assert node.resume("w", (1,))                         # degree 1, device 1
        node.step([((1,), ["w"])])
        node.park("w")
        assert node.resume("w", (0, 1))                       # from host pages to degree 2
        node.step([((0, 1), ["w"])])
        got = node.decode("w")                                # gathered onto device 0
        assert got.shape == expected.shape == (5, 48, 64, 3)
        assert np.abs(got.astype(int) - expected.astype(int)).max() <= 1
        node.release("w")
        assert _pages(node) == {0: (0, 0), 1: (0, 0)}


def test_a_move_behind_a_busy_source_waits_for_its_step(node):
    """Request m is re-sharded off device 1 while device 1 runs another request's step (the
    step command sent first): the move's wait (until the last device began it) covers
    most of that step, and its copy does not (what ``observe_move`` learns is the copy and
    the control path, not the wait)."""
    from ditmem.parallel import commands as cmd

    assert node.encode(_request("m", 1, 64, 64, cfg=False), 1)
    assert node.encode(_request("busy", 2, 512, 512, cfg=True), 1)  # a step >> the pipes
    try:
        idle = node.move("m", (0,))
        node.move("m", (1,))
        stepping = node.submit({1: cmd.Step(["busy"], (1,))})
        behind = node.move("m", (0,))
        step_s = stepping[1].result(timeout=120).seconds
    finally:
        node.release("m")
        node.release("busy")
    assert idle.wait_s < 0.5 * step_s
    assert behind.wait_s >= 0.8 * step_s > 0
    assert behind.copy_s < behind.wait_s
    assert behind.own_s == pytest.approx(behind.wall_s - behind.wait_s)
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}


def test_move_latency_is_measured_on_idle_workers(node):
    from ditmem.parallel.move_latency import measure_move_latency

    m = measure_move_latency(node, repeats=3)
    assert m["commands"] == 21
    assert set(m["by_kind_s"]) == {"peer", "offload", "restore"}
    assert 0 < m["move_latency_s"] <= m["wall_s"] + 1e-9 < 1.0
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}  # the probe is gone


def test_engine_devices_report_each_moves_own_time(node):
    """A job restoring one parked request (from the host) and moving another held one over
    the device link, and one priced through the host (park + restore): one own time per
    planned move in ``Timings.move_s``, in the job's order; the commands are recorded."""
    from ditmem.parallel.devices import EngineDevices
    from ditmem.scheduler import Request
    from ditmem.scheduler.node.device import Job, Move
    from ditmem.scheduler.node.topology import Node
    from ditmem.tools.replay import to_generation

    reqs = {rid: Request(rid, 0.0, width=64, height=64, steps=2, seed=i)
            for i, rid in enumerate(("parked", "peer", "via-host"))}
    for r in reqs.values():
        assert node.encode(to_generation(r), 0)
    node.park("parked")
    cost, node_cost = _node_cost()
    topo = Node(2, node_cost(cost).links)
    d0, d1 = topo.groups(1)
    devices = EngineDevices(node, to_generation)
    moves = [Move(reqs["parked"], None, d1, "restore"), Move(reqs["peer"], d0, d1, "peer"),
             Move(reqs["via-host"], d0, d1, "host")]
    devices.launch(Job(0, d1, list(reqs.values()), 1, moves), 0.0)
    (done,) = devices.wait(None)
    try:
        assert not devices.errors, devices.errors
        assert len(done.timings.move_s) == 3 and all(s > 0 for s in done.timings.move_s)
        assert done.timings.transfer_s == pytest.approx(sum(done.timings.move_s))
        assert [m.kind for m in devices.moves] == ["restore", "peer", "host-park",
                                                   "host-restore"]
        assert node.stats()[1].held == sorted(reqs)
    finally:
        for rid in reqs:
            node.release(rid)
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}


def test_a_requests_peak_pages_sum_its_parts_on_every_device(node):
    """After its encode and each step: the request's pages summed over the devices holding a
    part (checked against the pools' own counts, the request alone on the node); the peak
    is the largest such sum over its life, kept through a park and a restore elsewhere."""
    r = _request("peak", 3, 64, 48, cfg=True)
    assert node.encode(r, 1)
    node.step([((1,), ["peak"])])
    alone = _pages(node)
    assert alone[0] == (0, 0) and alone[1][0] > 0
    assert node.peak_pages("peak") == alone[1][0]
    node.move("peak", (0, 1))
    node.step([((0, 1), ["peak"])])
    sharded = _pages(node)
    both = sharded[0][0] + sharded[1][0]
    assert both > alone[1][0]  # text and scalars are on both devices
    assert node.peak_pages("peak") == both
    node.park("peak")
    assert node.restore("peak", (0,)) is not None
    node.step([((0,), ["peak"])])
    assert _pages(node)[0][0] == alone[1][0]
    assert node.peak_pages("peak") == both  # the peak over its life
    node.release("peak")
    assert node.peak_pages("peak", forget=True) == both
    assert node.peak_pages("peak") == 0 and "peak" not in node.request_pages
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}
