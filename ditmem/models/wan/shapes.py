"""Request arithmetic of a ``WanPipeline``: validation, latent shape, token counts.

Pure functions of the pipeline's configuration (VAE scale factors, patch size, channels);
no model work, so admission and page estimates can use them freely.
"""

from __future__ import annotations

from dataclasses import dataclass

from ditmem.models.common.request import GenerationRequest


@dataclass(slots=True, frozen=True)
class WanShapes:
    """spatial/temporal: VAE scale factors; patch: transformer patch ``(t, h, w)``;
    channels: latent channels; inner_dim: transformer width (heads * head_dim)."""

    spatial: int
    temporal: int
    patch: tuple[int, int, int]
    channels: int
    inner_dim: int

    @staticmethod
    def of(pipe) -> WanShapes:
        cfg = pipe.transformer.config
        return WanShapes(pipe.vae_scale_factor_spatial, pipe.vae_scale_factor_temporal,
                         tuple(cfg.patch_size), cfg.in_channels,
                         cfg.num_attention_heads * cfg.attention_head_dim)

    def check(self, request: GenerationRequest) -> None:
        """ValueError naming the field when the pipeline cannot run ``request`` as given."""
        multiple = self.spatial * self.patch[1]
        for name in ("width", "height"):
            v = getattr(request, name)
            if v <= 0 or v % multiple:
                raise ValueError(f"request.{name}: must be a positive multiple of {multiple}, "
                                 f"got {v}")
        t = self.temporal
        if request.num_frames < 1 or request.num_frames % t != 1:
            raise ValueError(f"request.num_frames: must be {t}k+1 (1, {t + 1}, {2 * t + 1}, "
                             f"...), got {request.num_frames}")
        if request.num_inference_steps < 1:
            raise ValueError("request.num_inference_steps: must be >= 1, got "
                             f"{request.num_inference_steps}")

    def latent_shape(self, request: GenerationRequest) -> tuple[int, int, int, int, int]:
        """``(1, C, F_latent, H / spatial, W / spatial)`` as ``prepare_latents`` draws it."""
        frames = (request.num_frames - 1) // self.temporal + 1
        return (1, self.channels, frames, request.height // self.spatial,
                request.width // self.spatial)

    def tokens(self, request: GenerationRequest) -> int:
        """Video tokens of one CFG branch (latent grid / patch)."""
        _, _, f, h, w = self.latent_shape(request)
        p_t, p_h, p_w = self.patch
        return (f // p_t) * (h // p_h) * (w // p_w)
