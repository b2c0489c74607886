"""A decode split over two CPU devices (worker processes, gloo), tile by tile: the image
equals the one-device tiled decode bit for bit (same tiles, same blend), no page or shared
segment is left, and a failed split decode fails only its request."""

from __future__ import annotations

import os

import numpy as np
import pytest
from node_cases import pages as _pages
from node_cases import tiny_node

from ditmem.models.common.request import GenerationRequest
from ditmem.parallel.node import CommandFailed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 2
TILE = (64, 48)  # a 128² latent of 16² decodes as 3 × 3 tiles


def _request(rid: str, seed: int, width: int = 128, height: int = 128) -> GenerationRequest:
    return GenerationRequest("a red cat on a mat", width=width, height=height,
                             num_inference_steps=STEPS, seed=seed, request_id=rid)


@pytest.fixture(scope="module")
def node():  # this module's own engine
    yield from tiny_node()


def _segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("psm_")}


def _finished(node, rid: str, seed: int, device: int = 0, **shape) -> None:
    assert node.encode(_request(rid, seed, **shape), device)
    for _ in range(STEPS):
        node.step([((device,), [rid])])


def test_split_decode_equals_the_one_device_tiled_decode_bit_for_bit(node):
    """The same request twice on device 0: one decoded tiled on device 0 alone, the other
    with its 9 tiles over devices 0 and 1 (5 + 4). Identical bits; device 1 handed back
    once its tiles are done; no page and no shared segment left."""
    _finished(node, "one", 5)
    _finished(node, "split", 5)
    expected = node.decode("one", TILE)
    node.release("one")
    before = _segments()
    freed = []
    image = node.decode_split("split", (0, 1), TILE, freed.append)
    node.release("split")
    assert freed == [(1,)]
    assert image.shape == (128, 128, 3) and image.dtype == np.uint8
    assert np.array_equal(image, expected)
    assert _segments() <= before
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}


def test_split_over_the_other_device_first_and_an_image_of_one_tile(node):
    """Held on device 1, split as (1, 0): device 1 blends; a 64² image is one tile, decoded
    whole on its holder (the other device gets no work)."""
    _finished(node, "ref", 9, device=1, width=64, height=128)
    _finished(node, "b", 9, device=1, width=64, height=128)
    expected = node.decode("ref", TILE)
    node.release("ref")
    assert np.array_equal(node.decode_split("b", (1, 0), TILE), expected)
    node.release("b")
    _finished(node, "small", 2, device=1, width=64, height=64)
    _finished(node, "small-ref", 2, device=1, width=64, height=64)
    freed = []
    small = node.decode_split("small", (1, 0), TILE, freed.append)
    assert np.array_equal(small, node.decode("small-ref", TILE))
    assert freed == []  # the other device got no tile
    for rid in ("small", "small-ref"):
        node.release(rid)
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}


def test_a_device_taken_back_between_tiles_leaves_its_tiles_to_the_holder(node):
    """9 tiles over (0, 1): device 1 is asked before its 2nd tile and taken back; it has
    decoded 1 tile, is handed back once, and its 3 other tiles run on device 0 after its 5.
    The image is the one-device tiled decode's, bit for bit; no page or segment left."""
    _finished(node, "whole", 7)
    _finished(node, "yield", 7)
    expected = node.decode("whole", TILE)
    node.release("whole")
    before = _segments()
    asked, freed = [], []

    def taken(device: int) -> bool:
        asked.append(device)
        return True

    image = node.decode_split("yield", (0, 1), TILE, freed.append, taken)
    node.release("yield")
    assert asked == [1] and freed == [(1,)]
    assert np.array_equal(image, expected)
    assert _segments() <= before
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}


def test_a_failed_split_decode_fails_only_its_request(node):
    """A split decode whose tiles cannot be cut (tile 60 px, not a multiple of the VAE's 8)
    raises ``CommandFailed``; its release leaves no page; another request held beside it
    still decodes, split, to the one-device bits."""
    _finished(node, "bad", 1)
    _finished(node, "good", 3)
    _finished(node, "good-ref", 3)
    before = _segments()
    with pytest.raises(CommandFailed, match="tile_px 60"):
        node.decode_split("bad", (0, 1), (60, 48))
    node.release("bad")
    assert np.array_equal(node.decode_split("good", (0, 1), TILE),
                          node.decode("good-ref", TILE))
    for rid in ("good", "good-ref"):
        node.release(rid)
    assert _segments() <= before
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}


def test_node_loop_with_split_decodes_on_real_devices(node):
    """run_node with slo(split_decodes=True) on the workers: every request finishes once,
    each image equal to the same request's under slo without the split (to within one
    uint8 level: the schedules, and so the degrees of the steps, may differ), no page
    left."""
    from test_node_engine import _node_cost

    from ditmem.parallel.devices import EngineDevices
    from ditmem.scheduler import Request
    from ditmem.scheduler.node.policies import make_node_policy
    from ditmem.scheduler.node.simulator import run_node
    from ditmem.scheduler.node.topology import Node
    from ditmem.tools.replay import to_generation

    cost, node_cost = _node_cost()
    shapes = [(128, 128), (64, 64), (128, 64)]
    outputs = {}
    for split in (False, True, "yield"):
        requests = [Request(f"q{i}", arrival=0.3 * i, width=w, height=h, steps=3, seed=i)
                    for i, (w, h) in enumerate(shapes)]
        truth = node_cost(cost)
        topo = Node(2, truth.links)
        devices = EngineDevices(node, to_generation, keep_outputs=True, decode_tile=TILE)
        policy = make_node_policy("slo", node_cost(cost), topo, split_decodes=bool(split),
                                  split_yield=split == "yield")
        result = run_node(requests, policy, devices, topo, truth)
        assert not devices.errors, devices.errors
        assert sorted(r.request.id for r in result.records) == ["q0", "q1", "q2"]
        outputs[split] = devices.outputs
        assert _pages(node) == {0: (0, 0), 1: (0, 0)}
        # every decode was measured and reported: the policy's decode factors moved
        # (one per shape class: 128² and 128 x 64 / 64² fall in two half-octaves at most)
        assert policy.ncost._decode_correction
        assert all(f != 1.0 for f in policy.ncost._decode_correction.values())
    for rid, image in outputs[False].items():
        w, h = shapes[int(rid[1:])]
        assert image.shape == (h, w, 3)
        for other in (True, "yield"):
            assert np.abs(image.astype(int) - outputs[other][rid].astype(int)).max() <= 1


def _tiled_cost():
    """The cpu-tiny profile with a node's sections (speed-up 1.8 at degree 2 for 4,096
    tokens) and a tile geometry as the engine cuts it (``TILE``: 64/48 px, 10 ms a tile)."""
    import json
    from pathlib import Path

    import ditmem.scheduler as sched
    from ditmem.scheduler import CostModel

    data = json.loads((Path(sched.__file__).parent / "profiles" / "cpu-tiny.json").read_text())
    data["parallel"] = {"qwen-image": {"tokens": [16, 4096], "source": "test",
                                       "speedup": {"1": [1.0, 1.0], "2": [1.2, 1.8]}}}
    data["links"] = {"device_bytes_per_s": 1e9, "host_bytes_per_s": 5e9, "source": "test"}
    data["models"]["qwen-image"].update(
        {k: {"value": v, "source": "test"} for k, v in
         (("decode_tile_px", 64), ("decode_stride_px", 48), ("decode_tile_s", 0.01))})
    return CostModel.from_dict(data)


def test_node_loop_takes_spares_back_on_real_devices(node, monkeypatch):
    """run_node on the workers, ``fifo`` on one degree-2 replica (every decode on the pair,
    split) with a profile that tiles as the engine does (64/48), 128² and 64² requests
    arriving while others run, and a take-back rule that takes every spare it is offered:
    the loop offers the spare of a split decode with requests waiting and the engine takes
    it back (``EngineDevices.reclaim``): a spare stops with tiles left, which run on the
    lane (its ``taken`` answers True); every image equals the unsplit run's, bit for bit;
    no page left."""
    from ditmem.parallel.devices import EngineDevices
    from ditmem.scheduler import Request
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.scheduler.node.policies import make_node_policy
    from ditmem.scheduler.node.simulator import run_node
    from ditmem.scheduler.node.topology import Node
    from ditmem.tools.replay import to_generation

    cost = _tiled_cost()
    shapes = [(128, 128), (64, 64)] * 4
    outputs, offered, stopped = {}, [], []
    split_decode = node.decode_split

    def spied(rid, devices, tile, on_tiles=None, taken=None):
        def asked(d):
            stop = taken(d)
            if stop:
                stopped.append((rid, d))
            return stop

        return split_decode(rid, devices, tile, on_tiles, asked if taken else None)

    monkeypatch.setattr(node, "decode_split", spied)
    for split in (False, True):
        requests = [Request(f"q{i}", arrival=0.01 * i, width=w, height=h, steps=3, seed=i)
                    for i, (w, h) in enumerate(shapes)]
        truth = NodeCost(cost)
        topo = Node(2, truth.links)
        policy = make_node_policy("fifo", NodeCost(cost), topo, baseline_degree=2)
        policy.split_decodes = policy.split_yield = split

        def grab(view):
            offered.append([sp.device for sp in view.spares])
            return offered[-1]

        policy.take_back = grab
        devices = EngineDevices(node, to_generation, keep_outputs=True, decode_tile=TILE)
        result = run_node(requests, policy, devices, topo, truth)
        assert not devices.errors, devices.errors
        assert len(result.records) == len(shapes)
        outputs[split] = devices.outputs
        assert _pages(node) == {0: (0, 0), 1: (0, 0)}
    assert offered and all(o == [1] for o in offered)
    assert stopped and all(d == 1 for _, d in stopped)
    for rid, image in outputs[False].items():
        assert np.array_equal(image, outputs[True][rid])


def test_the_node_demo_rows_agree_with_a_real_run_and_its_prediction(node):
    """``node_demo.run_policy`` (slo: split decodes that yield) on the workers and
    ``predict`` on the same three requests: one ``per_request`` row a request in arrival
    order, their met share equal to the run's attainment, the decisions counted (a split
    decode is one of two tiled requests' decodes at most, a take-back one per split at
    most); no page left."""
    import dataclasses

    from ditmem.scheduler import Request
    from ditmem.tools.node_demo import _Progress, predict, run_policy

    cost = _tiled_cost()
    shapes = [(128, 128), (64, 64), (128, 128)]
    trace = [Request(f"q{i}", arrival=0.05 * i, width=w, height=h, steps=3, seed=i)
             for i, (w, h) in enumerate(shapes)]
    for r in trace:
        cost.assign_deadline(r, 3.0)
    row = run_policy(node, "slo", [dataclasses.replace(r) for r in trace], cost, 2,
                     _Progress(False), TILE)
    sim = predict("slo", trace, cost, 2, seed=0)
    assert not row["errors"], row["errors"]
    assert _pages(node) == {0: (0, 0), 1: (0, 0)}
    for out in (row, sim):
        per = out["per_request"]
        assert [q["id"] for q in per] == ["q0", "q1", "q2"]
        assert sum(q["met"] for q in per) / 3 == pytest.approx(out["slo_attainment"])
        assert all(q["arrival_s"] <= q["started_s"] <= q["finished_s"] for q in per)
        d = out["decisions"]
        assert set(d) == {"take_backs", "split_decodes", "migrations"}
        assert 0 <= d["take_backs"] <= d["split_decodes"] <= 2  # q1 (64²) is one tile
    assert row["decisions"]["migrations"] == row["migrations"]
    # the engine process ran the loop: some CPU, and no more than its threads could spend
    assert 0 < row["engine_cpu_s"] < 4 * row["wall_s"]
