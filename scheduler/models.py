"""Model geometry the cost model needs: how many tokens a request's shape becomes.

Sources: ../shared/calibration.md "Model geometry" — Qwen-Image: 1 token per 16×16 px (VAE 8×,
patch 2); Wan-14B (Wan2.1-14B, each Wan2.2-A14B expert): VAE 4×8×8 + patch 1×2×2, 81 frames
→ 21 latent frames (480p 32,760 tokens; 720p 75,600); Wan2.2-TI2V-5B: VAE 4×16×16 + patch
1×2×2 (1280×704×121 → 27,280; 832×480×81 → 8,190).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Geometry:
    """Pixels per token along each axis and the temporal compression of the latent."""

    px_per_token: int
    temporal: int  # latent frames = 1 + (frames - 1) // temporal (1 for images)


GEOMETRY: dict[str, Geometry] = {
    "qwen-image": Geometry(px_per_token=16, temporal=4),
    "wan2.2-a14b": Geometry(px_per_token=16, temporal=4),
    "wan2.2-ti2v-5b": Geometry(px_per_token=32, temporal=4),
}


def known_models() -> tuple[str, ...]:
    return tuple(GEOMETRY)


def tokens_for(model: str, width: int, height: int, frames: int = 1) -> int:
    """Image/video tokens one denoising forward processes for this shape (int ≥ 1)."""
    geo = GEOMETRY.get(model)
    if geo is None:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(GEOMETRY)}")
    latent_frames = 1 + (frames - 1) // geo.temporal
    per_frame = max(1, width // geo.px_per_token) * max(1, height // geo.px_per_token)
    return per_frame * latent_frames
