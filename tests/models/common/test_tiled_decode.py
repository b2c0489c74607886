"""Tile-by-tile VAE decode vs the stock VAE's own tiled decode and pipeline decode tail."""

import numpy as np
import pytest
import torch

import ditmem.models as dm
from ditmem.memory import PagePool
from ditmem.models import GenerationRequest
from ditmem.models.common.tiled_decode import QwenDecodeJob, TiledDecode, decode_job
from ditmem.models.qwen.pipeline import decode_latents


@pytest.fixture(scope="module")
def gen():
    return dm.load("tiny-qwen-image", device="cpu", dtype=torch.float32)


@pytest.fixture()
def stock_tiling(gen):
    vae = gen.pipe.vae

    def enable(tile, stride):
        vae.enable_tiling(tile_sample_min_height=tile, tile_sample_min_width=tile,
                          tile_sample_stride_height=stride, tile_sample_stride_width=stride)

    yield enable
    vae.disable_tiling()
    vae.enable_tiling(tile_sample_min_height=256, tile_sample_min_width=256,
                      tile_sample_stride_height=192, tile_sample_stride_width=192)
    vae.disable_tiling()


@pytest.mark.parametrize("h, w, tile, stride", [
    (20, 28, 64, 48),    # 3 x 4 tiles with cut edge tiles
    (16, 16, 128, 96),   # fits one tile: decoded whole
    (24, 8, 64, 64),     # no overlap, one column
])
def test_tiles_equal_the_vaes_tiled_decode(gen, stock_tiling, h, w, tile, stride):
    vae = gen.pipe.vae
    z = torch.randn(1, vae.config.z_dim, 1, h, w, generator=torch.Generator().manual_seed(h * w))
    job = TiledDecode(vae, z, tile, stride)
    while not job.done:
        job.run_one()
    stock_tiling(tile, stride)
    with torch.no_grad():
        expected = vae.decode(z, return_dict=False)[0]
    assert torch.equal(job.result(), expected)
    if job.whole:
        assert job.units == 1


def test_request_decode_in_tiles_equals_the_pipeline_tail_with_tiling(gen, stock_tiling):
    pool = PagePool(num_pages=1024, page_bytes=1 << 12)
    req = GenerationRequest("a lighthouse", width=160, height=96, num_inference_steps=2, seed=3)
    state = gen.encode(req, pool)
    while not gen.is_done(state):
        gen.step([state])
    job = decode_job(gen, state, tile_px=64, stride_px=48)
    assert isinstance(job, QwenDecodeJob) and job.units == 2 * 4
    other = gen.encode(GenerationRequest("a cat", width=64, height=64, num_inference_steps=2,
                                         seed=1), pool)
    while not job.done:  # another request's work between tiles does not disturb it
        job.run_one()
        if not gen.is_done(other):
            gen.step([other])
    stock_tiling(64, 48)
    expected = decode_latents(gen.pipe, gen.latents(state), 96, 160)
    out = job.output()
    assert out.dtype == np.uint8 and out.shape == (96, 160, 3)
    np.testing.assert_array_equal(out, expected)
    gen.release(state)
    gen.release(other)


def test_bad_tiles_and_unsupported_generators_are_rejected(gen):
    z = torch.zeros(1, gen.pipe.vae.config.z_dim, 1, 8, 8)
    with pytest.raises(ValueError, match="multiples of 8"):
        TiledDecode(gen.pipe.vae, z, 60, 48)
    with pytest.raises(ValueError, match="stride_px <= tile_px"):
        TiledDecode(gen.pipe.vae, z, 64, 72)
    with pytest.raises(TypeError, match="QwenGenerator"):
        decode_job(object(), None)
    job = TiledDecode(gen.pipe.vae, z, 64, 64)
    with pytest.raises(RuntimeError, match="0 of 1"):
        job.result()
