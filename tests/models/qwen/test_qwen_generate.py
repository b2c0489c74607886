"""Step-decomposed Qwen-Image generation vs the stock pipeline; offload/restore; batching."""

import math
import random

import numpy as np
import pytest
import torch

import ditmem.models as dm
from ditmem.memory import HostPool, OffloadEngine, PagePool
from ditmem.models import GenerationRequest
from ditmem.models.common.generator import check_generator

PAGE = 1 << 12


@pytest.fixture(scope="module")
def gen():
    return check_generator(dm.load("tiny-qwen-image", device="cpu", dtype=torch.float32))


def _pool(pages=2048):
    return PagePool(num_pages=pages, page_bytes=PAGE)


CFG = GenerationRequest("a red cat on a mat", width=128, height=96, num_inference_steps=4,
                        negative_prompt="blurry", guidance_scale=4.0, seed=7)
PLAIN = GenerationRequest("a dog", width=64, height=112, num_inference_steps=5, seed=11,
                          guidance_scale=1.0)


def _run(gen, state, groups=None):
    while not gen.is_done(state):
        gen.step([state])
    return gen.latents(state)


@pytest.mark.parametrize("request_", [CFG, PLAIN], ids=["cfg", "no-cfg"])
def test_full_run_equals_stock_pipeline(gen, request_):
    pool = _pool()
    state = gen.encode(request_, pool)
    assert gen.progress(state) == (0, request_.num_inference_steps)
    latents = _run(gen, state)
    image = gen.decode(state)
    ref_latents = torch.as_tensor(gen.reference(request_, output="latents"))
    ref_image = gen.reference(request_)
    assert latents.shape == ref_latents.shape
    assert ((latents - ref_latents).norm() / ref_latents.norm()).item() <= 1e-4
    assert image.dtype == np.uint8 and image.shape == (request_.height, request_.width, 3)
    assert np.abs(image.astype(int) - ref_image.astype(int)).max() <= 1
    assert image.std() > 1  # not a constant image
    gen.release(state)
    assert pool.num_free_pages == pool.num_pages


def test_sigma_schedule_matches_hand_computation(gen):
    """Qwen-Image schedule: linear sigmas, exponential shift with mu from the token count,
    stretched so the last sigma is shift_terminal, then a final 0."""
    state = gen.encode(CFG, _pool())
    n, tokens = CFG.num_inference_steps, (CFG.height // 16) * (CFG.width // 16)
    cfg = gen.pipe.scheduler.config
    m = (cfg.max_shift - cfg.base_shift) / (cfg.max_image_seq_len - cfg.base_image_seq_len)
    mu = tokens * m + cfg.base_shift - m * cfg.base_image_seq_len
    lin = [1.0 - i * (1.0 - 1.0 / n) / (n - 1) for i in range(n)]
    shifted = [math.exp(mu) / (math.exp(mu) + (1 / s - 1)) for s in lin]
    scale = (1 - shifted[-1]) / (1 - cfg.shift_terminal)
    expected = [1 - (1 - s) / scale for s in shifted] + [0.0]
    assert state.scalars["sigmas"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert state.scalars["timesteps"] == pytest.approx([s * 1000 for s in expected[:-1]],
                                                       rel=1e-5)


def test_offload_restore_at_random_steps_is_bit_identical(gen):
    pool, host = _pool(), HostPool(num_pages=2048, page_bytes=PAGE)
    engine = OffloadEngine(pool, host)
    baseline = gen.encode(CFG, pool)
    expected = _run(gen, baseline)
    gen.release(baseline)

    rng = random.Random(0)
    state = gen.encode(CFG, pool)
    moved = 0
    while not gen.is_done(state):
        if rng.random() < 0.6:
            before = {t.pages[0] for t in state.tensors()}
            state.offload(engine)
            assert state.location == "host"
            blocker = pool.allocate_tensor(len(before) * 64, (), torch.uint8)  # take freed pages
            assert state.restore(engine)
            assert {t.pages[0] for t in state.tensors()}.isdisjoint(before)
            blocker.free()
            moved += 1
        gen.step([state])
    assert moved >= 2
    assert torch.equal(gen.latents(state), expected)
    gen.release(state)


def test_batched_states_of_different_sizes_equal_each_alone(gen):
    requests = [
        CFG,
        PLAIN,
        GenerationRequest("green hills", width=160, height=64, num_inference_steps=3, seed=1,
                          negative_prompt="dark", guidance_scale=2.5),
    ]
    pool = _pool()
    alone = []
    for r in requests:
        s = gen.encode(r, pool)
        alone.append(_run(gen, s))
        gen.release(s)
    states = [gen.encode(r, pool) for r in requests]
    while any(not gen.is_done(s) for s in states):
        gen.step([s for s in states if not gen.is_done(s)])
    for s, a in zip(states, alone, strict=True):
        assert torch.equal(gen.latents(s), a)
    assert not torch.equal(alone[0][:, :10], alone[2][:, :10])


def test_estimate_pages_and_pool_exhaustion(gen):
    for r in (CFG, PLAIN):
        pool = _pool()
        state = gen.encode(r, pool)
        assert gen.estimate_pages(r, PAGE) == state.num_pages
    need = gen.estimate_pages(CFG, PAGE)
    small = _pool(need - 1)
    assert gen.encode(CFG, small) is None
    assert small.num_free_pages == small.num_pages  # nothing leaked
    assert gen.encode(CFG, _pool(need)) is not None


def test_misuse_errors(gen):
    pool = _pool()
    state = gen.encode(PLAIN, pool)
    with pytest.raises(ValueError, match="has run 0 of 5"):
        gen.decode(state)
    with pytest.raises(ValueError, match="twice"):
        gen.step([state, state])
    engine = OffloadEngine(pool, HostPool(num_pages=256, page_bytes=PAGE))
    state.offload(engine)
    with pytest.raises(ValueError, match="host"):
        gen.step([state])
    state.restore(engine)
    _run(gen, state)
    with pytest.raises(ValueError, match="finished"):
        gen.step([state])
    with pytest.raises(ValueError, match="multiple of 16"):
        gen.encode(GenerationRequest("x", width=100, height=64), pool)
    with pytest.raises(ValueError, match="num_frames"):
        gen.encode(GenerationRequest("x", num_frames=5), pool)


def test_chunked_steps_paused_mid_step_are_bit_identical(gen):
    """Steps split at block boundaries, with the paused request offloaded mid-step and
    resumed next to different companions, end exactly like plain steps."""
    small = GenerationRequest("a cat", width=64, height=48, num_inference_steps=3,
                              negative_prompt="blurry", guidance_scale=4.0, seed=3)
    other = GenerationRequest("a dog", width=80, height=64, num_inference_steps=3, seed=4,
                              guidance_scale=1.0)
    pool = _pool(4096)
    expected = []
    for r in (small, other):
        s = gen.encode(r, pool)
        expected.append(_run(gen, s))
        gen.release(s)
    engine = OffloadEngine(pool, HostPool(num_pages=4096, page_bytes=PAGE))
    a, b = gen.encode(small, pool), gen.encode(other, pool)
    held = a.num_pages
    assert gen.step_blocks([a], 1)
    assert gen.block(a) == 1 and a.num_pages == held + gen.boundary_pages(small, PAGE)
    a.offload(engine)
    gen.step([b])  # b runs a whole step while a is parked on the host mid-step
    assert a.restore(engine)
    with pytest.raises(ValueError, match="different blocks"):
        gen.step_blocks([a, b], 2)
    gen.step([a])  # finishes a's step from block 1
    assert gen.block(a) == 0 and a.num_pages == held
    assert gen.step_blocks([a, b], 1)
    gen.step([a, b])
    for s in (a, b):
        while not gen.is_done(s):
            gen.step([s])
    assert torch.equal(gen.latents(a), expected[0])
    assert torch.equal(gen.latents(b), expected[1])


def test_step_blocks_without_room_changes_nothing(gen):
    need = gen.estimate_pages(PLAIN, PAGE)
    pool = _pool(need + gen.boundary_pages(PLAIN, PAGE) - 1)
    state = gen.encode(PLAIN, pool)
    before = state.get("latents")
    assert gen.step_blocks([state], 1) is False
    assert gen.block(state) == 0 and gen.progress(state) == (0, PLAIN.num_inference_steps)
    assert torch.equal(state.get("latents"), before)
    gen.step([state])  # a whole step needs no boundary pages
    assert gen.progress(state)[0] == 1
