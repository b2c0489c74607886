"""Step-decomposed Wan generation vs the stock WanPipeline, and offload/restore identity."""

import random

import numpy as np
import pytest
import torch

import ditmem.models as dm
from ditmem.memory import HostPool, OffloadEngine, PagePool
from ditmem.models.common.generator import check_generator

PAGE = 1 << 14
TEXT = 64  # max_sequence_length: the pipeline pads prompts to it (512 in real Wan)


def _requests():
    return [
        dm.GenerationRequest("a cat on a boat", width=64, height=64, num_frames=9,
                             num_inference_steps=4, negative_prompt="blurry",
                             guidance_scale=5.0, seed=1, request_id="a"),
        dm.GenerationRequest("a dog running", width=48, height=80, num_frames=5,
                             num_inference_steps=6, guidance_scale=1.0, seed=2,
                             request_id="b"),
        dm.GenerationRequest("rain", width=32, height=32, num_frames=1,
                             num_inference_steps=3, guidance_scale=3.0, seed=3,
                             request_id="c"),  # CFG with the pipeline's default "" negative
    ]


def _run(gen, requests, pool, on_step=None):
    """Encode all, step the unfinished ones together until done; returns the states."""
    states = [gen.encode(r, pool) for r in requests]
    n = 0
    while any(not gen.is_done(s) for s in states):
        gen.step([s for s in states if not gen.is_done(s)])
        n += 1
        if on_step is not None:
            on_step(n, states)
    return states


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def gen():
    return check_generator(dm.load("tiny-wan", max_sequence_length=TEXT))


def test_full_run_equals_stock_pipeline(gen):
    requests = _requests()
    pool = PagePool(512, PAGE)
    states = _run(gen, requests, pool)
    for r, s in zip(requests, states, strict=True):
        assert gen.progress(s) == (r.num_inference_steps, r.num_inference_steps)
        ref = gen.reference(r, output="latents")
        assert _rel(gen.latents(s), ref) <= 1e-4
        video, ref_video = gen.decode(s), gen.reference(r)
        assert video.dtype == np.uint8 and video.shape == (r.num_frames, r.height, r.width, 3)
        assert np.abs(video.astype(int) - ref_video.astype(int)).max() <= 1
        gen.release(s)
    assert pool.num_free_pages == pool.num_pages


def test_two_experts_equal_stock_pipeline():
    gen = dm.load("tiny-wan", two_experts=True, max_sequence_length=TEXT)
    requests = _requests()[:2]  # 6 steps cross the 0.875 boundary; both experts run
    pool = PagePool(512, PAGE)
    states = _run(gen, requests, pool)
    assert pool.num_pages - pool.num_free_pages == sum(
        gen.estimate_pages(r, PAGE) for r in requests)
    assert set(states[1].scalars["experts"]) == {"transformer", "transformer_2"}
    for r, s in zip(requests, states, strict=True):
        assert _rel(gen.latents(s), gen.reference(r, output="latents")) <= 1e-4


def test_recomputed_text_kv_path_matches_cached(gen):
    plain = dm.load("tiny-wan", cache_cross_kv=False, max_sequence_length=TEXT)
    requests = _requests()[:2]
    cached = _run(gen, requests, PagePool(512, PAGE))
    pool = PagePool(512, PAGE)
    recomputed = _run(plain, requests, pool)
    assert pool.num_pages - pool.num_free_pages == sum(
        plain.estimate_pages(r, PAGE) for r in requests)
    for a, b in zip(cached, recomputed, strict=True):
        assert "prompt_embeds.cond" in b and "prompt_embeds.cond" not in a
        assert _rel(gen.latents(a), plain.latents(b)) <= 1e-5


@pytest.mark.parametrize("seed", [0, 1])
def test_offload_restore_into_other_pages_is_bit_identical(gen, seed):
    requests = _requests()
    straight = _run(gen, requests, PagePool(512, PAGE))
    pool, host = PagePool(512, PAGE), HostPool(512, PAGE)
    engine = OffloadEngine(pool, host)
    rng = random.Random(seed)
    moved = []

    def shuffle_pages(n, states):
        for s in states:
            if gen.is_done(s) or rng.random() < 0.4:
                continue
            old = {p for t in s.tensors() for p in t.pages}
            s.offload(engine)
            assert s.location == "host"
            with pytest.raises(ValueError, match="restore"):
                gen.step([s])
            held = pool.allocate(pool.num_free_pages)  # keep the old pages busy
            pool.free([p for p in held if p not in old])
            assert s.restore(engine)
            pool.free([p for p in held if p in old])
            assert old.isdisjoint(p for t in s.tensors() for p in t.pages)
            moved.append((n, s.request_id))

    shuffled = _run(gen, requests, pool, on_step=shuffle_pages)
    assert moved  # the run really was interrupted
    for a, b in zip(straight, shuffled, strict=True):
        assert torch.equal(gen.latents(a), gen.latents(b))
        assert np.array_equal(gen.decode(a), gen.decode(b))


def test_estimate_pages_is_exact_and_full_pool_returns_none(gen):
    for r in _requests():
        for page in (PAGE, 1 << 12):
            need = gen.estimate_pages(r, page)
            pool = PagePool(need + 3, page)
            state = gen.encode(r, pool)
            assert pool.num_pages - pool.num_free_pages == need
            gen.release(state)
            gen.release(state)  # idempotent
            assert need * page >= gen.state_bytes(r) > (need - 8) * page
            small = PagePool(need - 1, page)
            assert gen.encode(r, small) is None
            assert small.num_free_pages == need - 1  # nothing leaked


def test_step_and_request_errors(gen):
    pool = PagePool(256, PAGE)
    r = _requests()[2]
    state = gen.encode(r, pool)
    with pytest.raises(ValueError, match="empty"):
        gen.step([])
    with pytest.raises(ValueError, match="twice"):
        gen.step([state, state])
    with pytest.raises(ValueError, match="has run 0 of 3"):
        gen.decode(state)
    while not gen.is_done(state):
        gen.step([state])
    with pytest.raises(ValueError, match="finished"):
        gen.step([state])
    with pytest.raises(ValueError, match="state_bytes"):
        gen.estimate_pages(r, 4)
    for bad, match in [(dict(num_frames=4), "num_frames"), (dict(width=40), "width"),
                       (dict(num_inference_steps=0), "num_inference_steps")]:
        fields = {"width": 32, "height": 32, "num_frames": 1, "num_inference_steps": 2, **bad}
        req = dm.GenerationRequest("x", **fields)
        with pytest.raises(ValueError, match=match):
            gen.encode(req, pool)


def test_pause_inside_step_offload_resume_is_bit_identical(gen):
    """Steps split at block 1 of 2, the paused requests parked on the host and restored into
    other pages before the rest of the step: same latents as whole steps."""
    requests = _requests()[:2]
    straight = _run(gen, requests, PagePool(512, PAGE))
    pool, host = PagePool(512, PAGE), HostPool(512, PAGE)
    engine = OffloadEngine(pool, host)
    states = [gen.encode(r, pool) for r in requests]
    assert gen.num_blocks == 2
    while any(not gen.is_done(s) for s in states):
        live = [s for s in states if not gen.is_done(s)]
        free_before = pool.num_free_pages
        assert gen.step_blocks(live, 1)
        assert all(gen.block(s) == 1 for s in live)
        assert free_before - pool.num_free_pages == sum(
            gen.boundary_pages(r, PAGE) for r, s in zip(requests, states, strict=True)
            if s in live)
        for s in live:
            old = {p for t in s.tensors() for p in t.pages}
            s.offload(engine)
            held = pool.allocate(pool.num_free_pages)
            pool.free([p for p in held if p not in old])
            assert s.restore(engine)
            pool.free([p for p in held if p in old])
        with pytest.raises(ValueError, match="different blocks"):
            gen.step_blocks(live + [gen.encode(requests[0], pool)], 2)
        assert gen.step_blocks(live, 2)
        assert all(gen.block(s) == 0 and "boundary.hidden.cond" not in s for s in live)
    for a, b in zip(straight, states, strict=True):
        assert torch.equal(gen.latents(a), gen.latents(b))


def test_no_room_for_boundary_changes_nothing(gen):
    r = _requests()[0]
    need = gen.estimate_pages(r, PAGE)
    pool = PagePool(need, PAGE)
    state = gen.encode(r, pool)
    before = gen.latents(state)
    assert not gen.step_blocks([state], 1)
    assert gen.block(state) == 0 and gen.progress(state) == (0, r.num_inference_steps)
    assert torch.equal(gen.latents(state), before)
    gen.step([state])  # a whole step needs no extra pages
    assert gen.progress(state)[0] == 1


def test_a_request_is_batch_invariant(gen):
    """Conditioning is per request and every other op is row-wise, so a request's latents
    do not depend on which requests share its steps (same device, dtype and threads)."""
    requests = _requests() + [  # 6 video tokens: below the row count where MKL's bits change
        dm.GenerationRequest("tiny", width=32, height=48, num_frames=1, num_inference_steps=3,
                             guidance_scale=1.0, seed=4, request_id="d")]
    alone = [_run(gen, [r], PagePool(256, PAGE))[0] for r in requests]
    together = _run(gen, requests, PagePool(512, PAGE))
    for a, b in zip(alone, together, strict=True):
        assert torch.equal(gen.latents(a), gen.latents(b))


def test_load_from_a_diffusers_folder(tmp_path):
    from ditmem.models.wan.tiny import build_pipeline

    build_pipeline().save_pretrained(tmp_path)
    try:
        import accelerate  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="accelerate"):
            dm.load(str(tmp_path))
        return
    gen = dm.load(str(tmp_path), max_sequence_length=TEXT)
    r = _requests()[2]
    (state,) = _run(gen, [r], PagePool(64, PAGE))
    tiny = dm.load("tiny-wan", max_sequence_length=TEXT)
    assert _rel(gen.latents(state), tiny.reference(r, output="latents")) <= 1e-4
