"""Steps run as chunks of blocks, parked between chunks (boundary activations offloaded to
the host while another request computes, restored into other pages): the final output is
bit-identical to uninterrupted runs, on tiny Qwen-Image and tiny Wan."""

import threading

import numpy as np
import pytest
import torch

import ditmem.models as dm
from ditmem.memory import HostPool, OffloadEngine, PagePool
from ditmem.models.common.chunked import ChunkRunner, boundary_bytes, boundary_names
from ditmem.ops import copy_blocks

QWEN_PAGE, WAN_PAGE = 1 << 12, 1 << 14


@pytest.fixture(scope="module")
def qwen():
    return dm.load("tiny-qwen-image", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def wan():
    return dm.load("tiny-wan", max_sequence_length=64)


QWEN_REQS = [
    dm.GenerationRequest("a red cat on a mat", width=128, height=96, num_inference_steps=4,
                         negative_prompt="blurry", guidance_scale=4.0, seed=7, request_id="a"),
    dm.GenerationRequest("a dog", width=64, height=112, num_inference_steps=3, seed=11,
                         guidance_scale=1.0, request_id="b"),
]
WAN_REQS = [
    dm.GenerationRequest("a cat on a boat", width=64, height=64, num_frames=9,
                         num_inference_steps=4, negative_prompt="blurry", guidance_scale=5.0,
                         seed=1, request_id="a"),
    dm.GenerationRequest("a dog running", width=48, height=80, num_frames=5,
                         num_inference_steps=3, guidance_scale=1.0, seed=2, request_id="b"),
]


def _alone(gen, request, page):
    pool = PagePool(4096, page)
    state = gen.encode(request, pool)
    while not gen.is_done(state):
        gen.step([state])
    return gen.latents(state), gen.decode(state)


def _park_inside_every_step(gen, requests, page):
    """``a`` runs each step as chunks of 1 block; after block 1 it is parked (boundary pages
    offloaded by a worker thread) while ``b`` runs a whole step; on odd steps the offload is
    finished and the boundary restored into other pages, on even steps resumed at once."""
    pool, host = PagePool(4096, page), HostPool(4096, page)
    engine = OffloadEngine(pool, host, mode="thread")
    runner = ChunkRunner(gen, engine)
    a, b = (gen.encode(r, pool) for r in requests)
    held_between_steps = a.num_pages
    n = 0
    while not gen.is_done(a):
        assert runner.run_chunk([a], 1) and gen.block(a) == 1
        names = boundary_names(a)
        assert names and boundary_bytes(a) > 0
        old = {p for name in names for p in a.paged(name).pages}
        parked = runner.park([a])
        if not gen.is_done(b):
            gen.step([b])  # computes while a's boundary pages are being offloaded
        if n % 2:
            assert runner.settle(parked, wait=True)
            assert a.location == "mixed"  # only the boundary left; the rest stayed
            grab = pool.allocate(pool.num_free_pages)
            pool.free([p for p in grab if p not in old])  # keep a's old pages taken
            assert runner.resume(parked)
            new = {p for name in names for p in a.paged(name).pages}
            assert not new & old  # restored into other pages
            pool.free([p for p in grab if p in old])
        else:
            assert runner.resume(parked)
        assert a.location == "device"
        assert runner.run_chunk([a], 1) and gen.block(a) == 0
        assert not boundary_names(a) and a.num_pages == held_between_steps
        n += 1
    while not gen.is_done(b):
        gen.step([b])
    engine.close()
    return (gen.latents(a), gen.decode(a)), (gen.latents(b), gen.decode(b))


@pytest.mark.parametrize("model", ["qwen", "wan"])
def test_parked_inside_steps_ends_bit_identical(model, request):
    gen = request.getfixturevalue(model)
    reqs, page = (QWEN_REQS, QWEN_PAGE) if model == "qwen" else (WAN_REQS, WAN_PAGE)
    expected = [_alone(gen, r, page) for r in reqs]
    got = _park_inside_every_step(gen, reqs, page)
    for (lat, img), (ref_lat, ref_img) in zip(got, expected, strict=True):
        assert torch.equal(lat, ref_lat)
        assert np.array_equal(img, ref_img)


def test_resume_while_the_offload_is_in_flight_cancels_it(qwen):
    release = threading.Event()

    def slow_copy(src, dst, mapping):
        release.wait(10)
        copy_blocks(src, dst, mapping)

    req = QWEN_REQS[1]
    ref_lat, _ = _alone(qwen, req, QWEN_PAGE)
    pool, host = PagePool(4096, QWEN_PAGE), HostPool(4096, QWEN_PAGE)
    engine = OffloadEngine(pool, host, mode="thread", copy_fn=slow_copy)
    runner = ChunkRunner(qwen, engine)
    s = qwen.encode(req, pool)
    assert runner.run_chunk([s], 1)
    pages = {p for n in boundary_names(s) for p in s.paged(n).pages}
    parked = runner.park([s])
    assert not runner.settle(parked)  # still copying
    threading.Timer(0.2, release.set).start()
    assert runner.resume(parked)  # cancelled: the data never left its pages
    assert {p for n in boundary_names(s) for p in s.paged(n).pages} == pages
    assert host.num_free_pages == 4096
    with pytest.raises(ValueError, match="already resumed"):
        runner.resume(parked)
    while not qwen.is_done(s):
        qwen.step([s])
    assert torch.equal(qwen.latents(s), ref_lat)
    engine.close()


def test_bad_use_is_refused(qwen):
    pool, host = PagePool(4096, QWEN_PAGE), HostPool(16, QWEN_PAGE)
    runner = ChunkRunner(qwen, OffloadEngine(pool, host))
    s = qwen.encode(QWEN_REQS[0], pool)
    with pytest.raises(ValueError, match="inside a step"):
        runner.park([s])  # between steps: nothing to park
    with pytest.raises(ValueError, match="positive int"):
        runner.run_chunk([s], 0)
    with pytest.raises(TypeError, match="cannot pause inside a step"):
        ChunkRunner(object(), runner.engine)


@pytest.fixture(scope="module")
def wan4():
    """Tiny Wan with 4 blocks: room for several chunk boundaries inside a step."""
    from ditmem.models.wan.generate import WanGenerator
    from ditmem.models.wan.tiny import build_pipeline, build_tiny_transformer

    pipe = build_pipeline()
    pipe.transformer = build_tiny_transformer(2, num_layers=4)
    return WanGenerator(pipe, name="tiny-wan-4L", max_sequence_length=64)


def test_open_step_writes_boundary_pages_only_when_paused(wan4, monkeypatch):
    """Consecutive chunks continue the packed batch in memory: pages are reserved by the
    first chunk but written only by a park / flush (or when other requests run); a stale
    page read is refused, and every path ends bit-identical to whole steps."""
    gen = wan4
    ref = {r.request_id: _alone(gen, r, WAN_PAGE)[0] for r in WAN_REQS}
    writes = []
    save = gen.save_boundary
    monkeypatch.setattr(gen, "save_boundary", lambda step: (writes.append(step), save(step)))
    pool, host = PagePool(4096, WAN_PAGE), HostPool(4096, WAN_PAGE)
    engine = OffloadEngine(pool, host, mode="thread")
    runner = ChunkRunner(gen, engine)
    a, b = (gen.encode(r, pool) for r in WAN_REQS)
    # step 1 of a: chunks of one block, no park: nothing written
    for block in (1, 2, 3):
        assert runner.run_chunk([a], 1) and gen.block(a) == block
        assert boundary_names(a) and not writes
    assert runner.run_chunk([a], 1) and gen.block(a) == 0 and not boundary_names(a)
    # step 2: open at block 1; the generator refuses to resume it from unwritten pages
    assert runner.run_chunk([a], 1)
    with pytest.raises(ValueError, match="open in a ChunkRunner"):
        gen.step([a])
    # other requests run meanwhile: the open step is flushed first, then resumed from pages
    assert runner.run_chunk([b], 2) and len(writes) == 1 and runner.open.states == [b]
    assert runner.run_chunk([a], 2) and gen.block(a) == 3 and len(writes) == 2
    runner.flush()
    assert len(writes) == 3 and runner.open is None
    gen.step([a])  # the generator finishes the step from the pages the flush wrote
    # step 3: parked after block 2 (boundary written by the park), dropped, resumed by step
    assert runner.run_chunk([a], 2)
    parked = runner.park([a])
    assert len(writes) == 4 and runner.open is None
    runner.drop(parked)
    gen.step([a])
    for s in (a, b):
        while not gen.is_done(s):
            assert runner.run_chunk([s], 3)
    engine.close()
    assert torch.equal(gen.latents(a), ref["a"]) and torch.equal(gen.latents(b), ref["b"])
