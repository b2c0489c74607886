"""The stock ``QwenImagePipeline`` pieces the generator reuses: request checks, the
pipeline's own ``__call__`` (the equivalence oracle) and its latent-to-image tail."""

from __future__ import annotations

import numpy as np
import torch

from ditmem.models.common.request import GenerationRequest
from ditmem.models.common.vae_output import denormalize_latents, to_uint8


def check_request(request: GenerationRequest, multiple: int) -> None:
    """ValueError naming the bad field unless ``request`` is a Qwen-Image job."""
    if request.num_frames != 1:
        raise ValueError(f"request.num_frames: Qwen-Image makes images, got {request.num_frames}")
    for name in ("width", "height"):
        v = getattr(request, name)
        if v <= 0 or v % multiple:
            raise ValueError(f"request.{name}: must be a positive multiple of {multiple}, got {v}")
    if request.num_inference_steps < 1:
        raise ValueError(
            f"request.num_inference_steps: must be >= 1, got {request.num_inference_steps}"
        )


@torch.no_grad()
def run_pipeline(pipe, request: GenerationRequest, cfg: bool, max_sequence_length: int,
                 latents: bool = False):
    """``pipe.__call__`` for ``request`` with a CPU generator seeded by ``request.seed``:
    ``uint8 [H, W, 3]``, or the final packed latents ``[1, S, C]`` when ``latents``."""
    result = pipe(
        prompt=request.prompt,
        negative_prompt=request.negative_prompt if cfg else None,
        true_cfg_scale=request.guidance_scale if cfg else 1.0,
        height=request.height,
        width=request.width,
        num_inference_steps=request.num_inference_steps,
        generator=torch.Generator("cpu").manual_seed(request.seed),
        max_sequence_length=max_sequence_length,
        output_type="latent" if latents else "np",
    ).images
    return result if latents else to_uint8(result[0])


@torch.no_grad()
def decode_latents(pipe, latents: torch.Tensor, height: int, width: int) -> np.ndarray:
    """The pipeline's decode tail: unpack ``[1, S, C]`` latents, undo the latent
    normalisation, VAE-decode, postprocess -> ``uint8 [H, W, 3]``."""
    x = pipe._unpack_latents(latents, height, width, pipe.vae_scale_factor).to(pipe.vae.dtype)
    image = pipe.vae.decode(denormalize_latents(pipe.vae, x), return_dict=False)[0][:, :, 0]
    return to_uint8(pipe.image_processor.postprocess(image, output_type="np")[0])
