"""A VAE decode split into spatial tiles that run one at a time: a decode the engine can
pause between tiles (``Engine(decode="tiled")``) so that a large image's decode does not
hold the device for seconds while an urgent request waits.

The tiles, their order and the blending are those of the Qwen-Image VAE's own tiled decode
(``AutoencoderKLQwenImage.enable_tiling`` with ``tile_sample_min_* = tile_px`` and
``tile_sample_stride_* = stride_px``), so the image equals the stock pipeline's with that
tiling enabled, bit for bit. An image no larger than one tile decodes whole, in one unit,
as the VAE itself does.
"""

from __future__ import annotations

import numpy as np
import torch

from ditmem.memory import RequestState
from ditmem.models.common.generator import check_finished
from ditmem.models.common.vae_output import denormalize_latents, to_uint8

#: Default tile and stride in pixels: 32-pixel blends, about 0.1 s a tile for tiny-qwen-image
#: on one CPU core.
DEFAULT_TILE_PX = 256
DEFAULT_STRIDE_PX = 224


class TiledDecode:
    """Decode ``z [1, C, F, h, w]`` (de-normalised latents in the VAE's dtype) tile by tile.

    ``units`` tiles; :meth:`run_one` decodes the next; :meth:`result` blends them into
    ``[1, 3, F, H, W]`` floats once :attr:`done`. A decode split over devices runs
    :meth:`decode_tile` of some indices on each and :meth:`put` s them into one.
    """

    def __init__(self, vae, z: torch.Tensor, tile_px: int = DEFAULT_TILE_PX,
                 stride_px: int = DEFAULT_STRIDE_PX):
        ratio = vae.spatial_compression_ratio
        if z.dim() != 5 or z.shape[0] != 1:
            raise ValueError(f"z must be [1, C, F, h, w], got {tuple(z.shape)}")
        if tile_px % ratio or stride_px % ratio or not 0 < stride_px <= tile_px:
            raise ValueError(
                f"tile_px {tile_px} and stride_px {stride_px} must be multiples of {ratio} "
                f"with 0 < stride_px <= tile_px")
        self.vae, self.z = vae, z
        self.tile_px, self.stride_px = tile_px, stride_px
        self._tile, self._stride = tile_px // ratio, stride_px // ratio
        _, _, _, h, w = z.shape
        self.whole = h <= self._tile and w <= self._tile
        self.rows = [0] if self.whole else list(range(0, h, self._stride))
        self.cols = [0] if self.whole else list(range(0, w, self._stride))
        self._tiles: dict[int, torch.Tensor] = {}

    @property
    def units(self) -> int:
        return len(self.rows) * len(self.cols)

    @property
    def done(self) -> bool:
        return len(self._tiles) == self.units

    @torch.no_grad()
    def run_one(self) -> None:
        """Decode the next tile not decoded yet (row-major order)."""
        if self.done:
            raise RuntimeError("every tile is already decoded")
        index = next(k for k in range(self.units) if k not in self._tiles)
        self._tiles[index] = self.decode_tile(index)

    @torch.no_grad()
    def decode_tile(self, index: int) -> torch.Tensor:
        """Tile ``index`` (row-major) decoded: ``[1, 3, F, th, tw]`` floats, not kept (a
        split decode runs some tiles here and :meth:`put` s the others' from elsewhere)."""
        if not 0 <= index < self.units:
            raise ValueError(f"index must be in [0, {self.units}), got {index}")
        vae = self.vae
        if self.whole:
            return vae.decode(self.z, return_dict=False)[0]
        i = self.rows[index // len(self.cols)]
        j = self.cols[index % len(self.cols)]
        vae.clear_cache()
        frames = []
        for k in range(self.z.shape[2]):
            vae._conv_idx = [0]
            part = vae.post_quant_conv(self.z[:, :, k:k + 1, i:i + self._tile, j:j + self._tile])
            frames.append(vae.decoder(part, feat_cache=vae._feat_map, feat_idx=vae._conv_idx))
        vae.clear_cache()
        return torch.cat(frames, dim=2)

    def put(self, index: int, tile: torch.Tensor) -> None:
        """Keep ``tile`` (what :meth:`decode_tile` of ``index`` returned, here or on another
        device with the same VAE and latents) as tile ``index``."""
        if not 0 <= index < self.units:
            raise ValueError(f"index must be in [0, {self.units}), got {index}")
        if index in self._tiles:
            raise ValueError(f"tile {index} is already decoded")
        self._tiles[index] = tile

    @torch.no_grad()
    def result(self) -> torch.Tensor:
        """The decoded pixels ``[1, 3, F, H, W]`` (floats, as the VAE returns them)."""
        if not self.done:
            raise RuntimeError(f"{len(self._tiles)} of {self.units} tiles decoded")
        if self.whole:
            return self._tiles[0]
        vae, cols = self.vae, len(self.cols)
        tiles = [self._tiles[k] for k in range(self.units)]
        grid = [tiles[r * cols:(r + 1) * cols] for r in range(len(self.rows))]
        blend = self.tile_px - self.stride_px
        out_rows = []
        for r, row in enumerate(grid):
            kept = []
            for c, tile in enumerate(row):
                if r > 0:
                    tile = vae.blend_v(grid[r - 1][c], tile, blend)
                if c > 0:
                    tile = vae.blend_h(row[c - 1], tile, blend)
                kept.append(tile[:, :, :, :self.stride_px, :self.stride_px])
            out_rows.append(torch.cat(kept, dim=-1))
        ratio = vae.spatial_compression_ratio
        height, width = self.z.shape[3] * ratio, self.z.shape[4] * ratio
        return torch.cat(out_rows, dim=3)[:, :, :, :height, :width]


class QwenDecodeJob:
    """The decode of a finished Qwen-Image request as tiles: ``run_one()`` until ``done``,
    then ``output()`` -> ``uint8 [H, W, 3]`` (the pipeline's decode tail with VAE tiling).
    Built from the request's ``state``, or from its ``latent`` (another device's job's
    :attr:`latent`: a decode split over devices, ``decode_tile`` here, ``put`` there)."""

    def __init__(self, gen, state: RequestState | None, tile_px: int = DEFAULT_TILE_PX,
                 stride_px: int = DEFAULT_STRIDE_PX, *, latent: torch.Tensor | None = None):
        pipe = gen.pipe
        if (state is None) == (latent is None):
            raise ValueError("give exactly one of state and latent")
        if state is not None:
            check_finished(state, gen.progress(state))
            height, width = state.scalars["height"], state.scalars["width"]
            x = pipe._unpack_latents(state.get("latents"), height, width,
                                     pipe.vae_scale_factor)
            latent = denormalize_latents(pipe.vae, x.to(pipe.vae.dtype))
        self._pipe = pipe
        self._tiles = TiledDecode(pipe.vae, latent, tile_px, stride_px)

    @property
    def latent(self) -> torch.Tensor:
        """The de-normalised latents ``[1, C, F, h, w]`` the tiles decode (what another
        device's job for the same request is built from: ``latent=``)."""
        return self._tiles.z

    def decode_tile(self, index: int) -> torch.Tensor:
        return self._tiles.decode_tile(index)

    def put(self, index: int, tile: torch.Tensor) -> None:
        self._tiles.put(index, tile)

    @property
    def units(self) -> int:
        return self._tiles.units

    @property
    def done(self) -> bool:
        return self._tiles.done

    def run_one(self) -> None:
        self._tiles.run_one()

    def output(self) -> np.ndarray:
        image = self._tiles.result()[:, :, 0]
        return to_uint8(self._pipe.image_processor.postprocess(image, output_type="np")[0])


def decode_job(gen, state: RequestState, tile_px: int = DEFAULT_TILE_PX,
               stride_px: int = DEFAULT_STRIDE_PX):
    """A tile-by-tile decode job for a finished ``state`` of ``gen``.

    A generator may provide its own ``decode_job(state, tile_px, stride_px)``; the
    Qwen-Image generator is supported here. Others raise TypeError (say which): their
    decode runs whole.
    """
    own = getattr(gen, "decode_job", None)
    if callable(own):
        return own(state, tile_px, stride_px)
    from ditmem.models.qwen.generate import QwenGenerator

    if isinstance(gen, QwenGenerator):
        return QwenDecodeJob(gen, state, tile_px, stride_px)
    raise TypeError(f"tiled decode is supported for QwenGenerator (tiny-qwen-image, "
                    f"Qwen-Image weights), not {type(gen).__name__}")


def supports_tiled_decode(gen) -> bool:
    """Whether :func:`decode_job` can split ``gen``'s decodes into tiles."""
    from ditmem.models.qwen.generate import QwenGenerator

    return callable(getattr(gen, "decode_job", None)) or isinstance(gen, QwenGenerator)
