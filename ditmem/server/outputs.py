"""Encoding of generated images and videos for API responses: PNG, MP4 (H.264 through
PyAV, which ships the codec) and animated GIF. Encoding is CPU work: call these off the
event loop."""

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


def mp4_bytes(frames: np.ndarray, fps: int = 16, crf: int = 18) -> bytes:
    """uint8 ``[F, H, W, 3]`` -> MP4 bytes (H.264, yuv420p, ``fps`` frames per second).
    Odd sides are padded by one edge pixel (4:2:0 needs even sides)."""
    import av

    if frames.ndim == 3:
        frames = frames[None]
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"mp4_bytes: frames must be uint8 [F, H, W, 3], got {frames.dtype} "
                         f"{tuple(frames.shape)}")
    if not isinstance(fps, int) or fps < 1:
        raise ValueError(f"mp4_bytes: fps must be a positive int, got {fps!r}")
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf), "preset": "veryfast"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def first_frame(output: np.ndarray) -> np.ndarray:
    """An image output as ``[H, W, 3]`` (the first frame of a one-frame video)."""
    return output[0] if output.ndim == 4 else output
