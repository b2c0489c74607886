"""Model geometry the cost model needs: how many tokens a request's shape becomes.

Sources: ../shared/calibration.md "Model geometry" — Qwen-Image: 1 token per 16×16 px (VAE 8×,
patch 2); Wan-14B (Wan2.1-14B, each Wan2.2-A14B expert): VAE 4×8×8 + patch 1×2×2, 81 frames
→ 21 latent frames (480p 32,760 tokens; 720p 75,600); Wan2.2-TI2V-5B: VAE 4×16×16 + patch
1×2×2 (1280×704×121 → 27,280; 832×480×81 → 8,190). Transformer blocks and hidden size from the
same table: Qwen-Image 60 dual-stream blocks × 3072, Wan-14B 40 × 5120, Wan-5B 30 × 3072.
Block-boundary activations (what a step paused between blocks must keep): the image/video
hidden states, plus for Qwen-Image's dual-stream blocks the text hidden states (prompt length,
~10–300 tokens: 256 assumed), per CFG branch, in bf16 (2 bytes) — Wan 720p: 75,600 × 5120 × 2
≈ 0.77 GB per branch, as calibration.md says. Wan's text enters through cross-attention K/V
that are already cached per request, so no text stream is kept for Wan.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Geometry:
    """Pixels per token along each axis and the temporal compression of the latent."""

    px_per_token: int
    temporal: int  # latent frames = 1 + (frames - 1) // temporal (1 for images)
    blocks: int  # transformer blocks per forward
    hidden: int  # hidden size of the block-boundary activations
    text_stream_tokens: int = 0  # text tokens carried through the blocks (dual-stream)
    activation_dtype_bytes: int = 2  # bf16


GEOMETRY: dict[str, Geometry] = {
    "qwen-image": Geometry(16, 4, blocks=60, hidden=3072, text_stream_tokens=256),
    "wan2.2-a14b": Geometry(16, 4, blocks=40, hidden=5120),
    "wan2.2-ti2v-5b": Geometry(32, 4, blocks=30, hidden=3072),
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


def geometry(model: str) -> Geometry:
    """The geometry record of ``model`` (ValueError naming the known models otherwise)."""
    geo = GEOMETRY.get(model)
    if geo is None:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(GEOMETRY)}")
    return geo
