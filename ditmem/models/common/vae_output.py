"""Latents-to-pixels steps the Qwen-Image and Wan pipelines share: undoing the latent
normalisation before the VAE, and rounding float pixels to ``uint8`` after it."""

from __future__ import annotations

import numpy as np
import torch


def denormalize_latents(vae, x: torch.Tensor) -> torch.Tensor:
    """``x [1, z_dim, F, H, W]`` (float) -> ``x / (1 / latents_std) + latents_mean`` per
    channel, from ``vae.config``, in ``x``'s dtype and device: the stock pipelines' own
    arithmetic before ``vae.decode`` (so the rounding matches theirs bit for bit)."""
    cfg = vae.config
    mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(x.device, x.dtype)
    inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(
        x.device, x.dtype)
    return x / inv_std + mean


def to_uint8(pixels: np.ndarray) -> np.ndarray:
    """float pixels in [0, 1] (``[H, W, 3]`` or ``[F, H, W, 3]``) -> uint8, rounded as
    diffusers' ``numpy_to_pil`` rounds."""
    return (pixels * 255).round().astype(np.uint8)
