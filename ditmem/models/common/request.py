"""What a user asks a generator for: one image or video."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class GenerationRequest:
    """One generation job as the engine hands it to a model.

    width/height in pixels; num_frames 1 for an image; guidance_scale is Qwen-Image's
    ``true_cfg_scale`` (CFG runs when > 1 and a negative prompt is given) or Wan's
    ``guidance_scale``; seed fixes the initial noise.
    """

    prompt: str
    width: int = 256
    height: int = 256
    num_inference_steps: int = 28
    num_frames: int = 1
    negative_prompt: str | None = None
    guidance_scale: float = 4.0
    seed: int = 0
    request_id: str = ""
