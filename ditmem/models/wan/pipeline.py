"""The stock ``WanPipeline`` pieces the Wan generator calls: loading, VAE decoding exactly
as ``__call__`` ends, and ``__call__`` itself as the equivalence oracle."""

from __future__ import annotations

import importlib.util

import numpy as np
import torch

from ditmem.models.common.processor_patch import original_processors
from ditmem.models.common.request import GenerationRequest
from ditmem.models.common.vae_output import denormalize_latents, to_uint8


def load_pipeline(name_or_path: str, device, dtype: torch.dtype, seed: int,
                  two_experts: bool):
    """``"tiny-wan"``: the embedded pipeline (weights from ``seed``; ``two_experts`` adds a
    Wan2.2-A14B-like ``transformer_2``); else a diffusers folder via ``from_pretrained``."""
    if name_or_path == "tiny-wan":
        from ditmem.models.wan.tiny import build_pipeline

        return build_pipeline(seed=seed, dtype=dtype, device=str(device),
                              two_experts=two_experts)
    from diffusers import WanPipeline

    if importlib.util.find_spec("accelerate") is None:
        raise RuntimeError(
            f"load({name_or_path!r}): diffusers loads WanTransformer3DModel (whose norms and "
            "modulation stay float32) only with the `accelerate` package, which is not "
            "installed")
    pipe = WanPipeline.from_pretrained(name_or_path, torch_dtype=dtype).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@torch.no_grad()
def decode_latents(pipe, latents: torch.Tensor) -> np.ndarray:
    """Latents ``[1, C, F, H, W]`` -> ``uint8 [F', H', W', 3]``: de-normalise, VAE decode
    and postprocess as the end of ``WanPipeline.__call__`` does."""
    x = latents.to(pipe.vae.device, pipe.vae.dtype)
    video = pipe.vae.decode(denormalize_latents(pipe.vae, x), return_dict=False)[0]
    return to_uint8(pipe.video_processor.postprocess_video(video, output_type="np")[0])


@torch.no_grad()
def run_reference(pipe, adapters, request: GenerationRequest, max_sequence_length: int,
                  output: str):
    """``pipe.__call__`` with the original attention processors (``adapters`` unpatched for
    the call): ``uint8 [F, H, W, 3]``, or the final latents with ``output="latents"``."""
    if output not in ("video", "latents"):
        raise ValueError(f"output: must be 'video' or 'latents', got {output!r}")
    with original_processors(adapters):
        frames = pipe(
            prompt=request.prompt, negative_prompt=request.negative_prompt,
            height=request.height, width=request.width, num_frames=request.num_frames,
            num_inference_steps=request.num_inference_steps,
            guidance_scale=request.guidance_scale,
            generator=torch.Generator("cpu").manual_seed(request.seed),
            max_sequence_length=max_sequence_length,
            output_type="latent" if output == "latents" else "np").frames
    return frames if output == "latents" else to_uint8(frames[0])
