"""The profile prices a tiled decode as ``decode_tile_s`` x each tile's share of a full
tile's pixels (``CostModel.decode_tiles``); the node demo's start-up measurement times one
``tile``² image's decode as that full tile. Here the decode a worker runs for a request
(``decode_job`` tile by tile, as ``Worker._decode`` does with a ``tile``) is counted: each
call of the VAE's decoder and the latent extent it gets, against the priced tiles, at the
demo's sides and tiling (256 px tiles, 224 px stride)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ditmem.models as dm
from ditmem.memory import PagePool
from ditmem.models import GenerationRequest
from ditmem.models.common.tiled_decode import decode_job
from ditmem.scheduler import Request
from ditmem.scheduler.cost import CostModel

PROFILE = Path(__file__).parents[2] / "benchmarks/parallel/results/demo_devices2_run4_profile.json"
TILE = (256, 224)


@pytest.fixture(scope="module")
def gen():
    return dm.load("tiny-qwen-image", device="cpu", dtype=torch.float32)


class CountingDecoder(torch.nn.Module):
    """Stands in for the VAE's decoder: records each call's latent (h, w), returns zeros
    of the decoded shape (no compute)."""

    def __init__(self, ratio: int):
        super().__init__()
        self.ratio = ratio
        self.calls: list[tuple[int, int]] = []

    def forward(self, x, feat_cache=None, feat_idx=None, **_):
        h, w = x.shape[-2:]
        self.calls.append((h, w))
        return torch.zeros(1, 3, x.shape[2], h * self.ratio, w * self.ratio, dtype=x.dtype)


@pytest.mark.parametrize("width, height, tiles, full_tiles", [
    (256, 256, 1, 1.0),        # the start-up measurement's image: one full tile
    (512, 512, 9, 5.0625),     # 256 + 256 + 64 px per side
    (1024, 1024, 25, 20.25),   # 4 x 256 + 128 px per side
    (1024, 512, 15, 10.125),  # wider than high: 5 columns, 3 rows
])
def test_the_worker_decode_runs_the_tiles_the_profile_prices(gen, width, height, tiles,
                                                             full_tiles):
    cost = CostModel.from_dict(json.loads(PROFILE.read_text()))
    section = cost.profile["models"]["qwen-image"]
    assert (section["decode_tile_px"], section["decode_stride_px"]) == TILE
    priced = cost.decode_tiles(Request("r", 0.0, "qwen-image", width=width, height=height,
                                       steps=1))
    vae = gen.pipe.vae
    counter = CountingDecoder(vae.spatial_compression_ratio)
    pool = PagePool(num_pages=4096, page_bytes=1 << 12)
    state = gen.encode(GenerationRequest("a lighthouse", width=width, height=height,
                                         num_inference_steps=2, seed=0), pool)
    while not gen.is_done(state):
        gen.step([state])
    decoder, vae.decoder = vae.decoder, counter  # a submodule: swapped back by hand
    try:
        job = decode_job(gen, state, *TILE)  # what Worker._decode runs for Decode(tile=TILE)
        while not job.done:
            job.run_one()
        assert job.output().shape == (height, width, 3)
    finally:
        vae.decoder = decoder
    ratio = vae.spatial_compression_ratio
    ran = [h * ratio * w * ratio / TILE[0] ** 2 for h, w in counter.calls]
    assert len(counter.calls) == len(priced) == tiles
    assert sum(ran) == pytest.approx(full_tiles)
    tile_s = section["decode_tile_s"]
    assert [p / tile_s for p in priced] == pytest.approx(ran)  # tile by tile, same order
    state.free()
