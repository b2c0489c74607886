"""Encoding of generated images and videos for API responses (PNG / animated GIF)."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image


def png_bytes(image: np.ndarray) -> bytes:
    """uint8 ``[H, W, 3]`` -> PNG file bytes."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"png_bytes: image must be uint8 [H, W, 3], got {image.dtype} "
                         f"{tuple(image.shape)}")
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def gif_bytes(frames: np.ndarray, fps: int = 16) -> bytes:
    """uint8 ``[F, H, W, 3]`` -> animated GIF bytes (one frame for images)."""
    if frames.ndim == 3:
        frames = frames[None]
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"gif_bytes: frames must be uint8 [F, H, W, 3], got {frames.dtype} "
                         f"{tuple(frames.shape)}")
    images = [Image.fromarray(f) for f in frames]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:],
                   duration=max(1, round(1000 / fps)), loop=0)
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def first_frame(output: np.ndarray) -> np.ndarray:
    """An image output as ``[H, W, 3]`` (the first frame of a one-frame video)."""
    return output[0] if output.ndim == 4 else output
