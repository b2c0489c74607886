"""Step-decomposed Qwen-Image generation (the :class:`~ditmem.models.common.generator.Generator`
protocol) on top of a stock ``QwenImagePipeline`` whose transformer is patched.

Every stage reuses the pipeline's own pieces so that a run equals ``pipeline.__call__``:
``encode_prompt`` for the text, ``prepare_latents`` with ``torch.Generator("cpu")
.manual_seed(seed)`` for the noise, a private copy of the scheduler (configured exactly as
the pipeline does: linear sigmas, ``mu`` from the image sequence length) for the sigma
schedule, and the pipeline's unpack / de-normalise / VAE / postprocess for the image. The
scheduler object itself is never stepped: each request's step index and sigmas live in its
``RequestState.scalars`` and the Euler update is done here, per request.

The state layout (tensor names, scalars) is in :mod:`ditmem.models.qwen.state`. A step can
also run in chunks of transformer blocks (``step_blocks``): between chunks the
block-boundary activations of each request sit in its pages, so a request paused inside a
step can be offloaded and resumed with other companions, bit-identically.

Equivalence with the stock pipeline: the transformer runs through
``ditmem.ops.paged_attention`` instead of SDPA, so latents match to a relative error of
about 1e-6 (tests assert <= 1e-4) and decoded uint8 images to within 1 level, not bit for
bit. The VAE's 3-D convolutions and RMS norms take faster CPU paths
(:mod:`ditmem.models.common.cpu_vae`: ~4 x faster decodes of small VAEs), so the generator's
``pipe`` decodes within 1e-4 relative of an unpatched one (uint8 within one level).
Against itself the path is deterministic and batch-invariant (see
``ditmem.models.common.packing.MIN_ROWS``): a request's latents are bit-identical whichever
requests share its steps and whether or not it was offloaded and restored in between.
"""

from __future__ import annotations

import numpy as np
import torch

from ditmem.memory import RequestState, pages_for
from ditmem.models.common.block_steps import BlockStepGenerator
from ditmem.models.common.cpu_vae import speed_up_vae
from ditmem.models.common.generator import (
    check_finished,
    check_step_states,
    common_block,
)
from ditmem.models.common.open_step import OpenStep, mark_boundary
from ditmem.models.common.processor_patch import original_processors
from ditmem.models.common.request import GenerationRequest
from ditmem.models.qwen import patch
from ditmem.models.qwen import state as qs
from ditmem.models.qwen.pipeline import check_request, decode_latents, run_pipeline


class QwenGenerator(BlockStepGenerator):
    """Generator for Qwen-Image pipelines (see module docstring). Steps: one packed forward
    over all states, then each request's true-CFG combination and Euler update."""

    def __init__(self, pipe, name: str = "tiny-qwen-image", block_size: int = 64,
                 max_sequence_length: int = 512):
        self.pipe = pipe
        self.name = name
        self.adapter = patch(pipe.transformer, block_size=block_size)
        self.vae_patch = speed_up_vae(pipe.vae)  # CPU fast paths (cpu_vae)
        self.device = pipe.transformer.device
        self.dtype = pipe.transformer.dtype
        self.max_sequence_length = max_sequence_length
        self.multiple = pipe.vae_scale_factor * 2
        self.channels = pipe.transformer.config.in_channels

    # ---------------------------------------------------------------- accounting
    def _uses_cfg(self, request: GenerationRequest) -> bool:
        return request.guidance_scale > 1 and request.negative_prompt is not None

    def _text_len(self, prompt: str) -> int:
        p = self.pipe
        ids = p.tokenizer(p.prompt_template_encode.format(prompt)).input_ids
        n = min(len(ids), p.tokenizer_max_length + p.prompt_template_encode_start_idx)
        return min(n - p.prompt_template_encode_start_idx, self.max_sequence_length)

    def estimate_pages(self, request: GenerationRequest, page_bytes: int) -> int:
        """Pages of ``page_bytes`` that :meth:`encode` will allocate for ``request`` (exact;
        tokenizes the prompt, no model work)."""
        check_request(request, self.multiple)
        tokens = (request.height // self.multiple) * (request.width // self.multiple)
        dim = self.pipe.transformer.config.joint_attention_dim
        prompts = [request.prompt] + ([request.negative_prompt] if self._uses_cfg(request) else [])
        total = pages_for(tokens * self.channels, (), self.dtype, page_bytes)
        for prompt in prompts:
            total += pages_for(self._text_len(prompt) * dim, (), self.dtype, page_bytes)
        return total

    # ---------------------------------------------------------------- stages
    def _schedule(self, image_seq_len: int, steps: int) -> tuple[list[float], list[float]]:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

        cfg = self.pipe.scheduler.config
        sched = type(self.pipe.scheduler).from_config(cfg)
        mu = calculate_shift(
            image_seq_len,
            cfg.get("base_image_seq_len", 256),
            cfg.get("max_image_seq_len", 4096),
            cfg.get("base_shift", 0.5),
            cfg.get("max_shift", 1.15),
        )
        sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), device="cpu", mu=mu)
        return sched.timesteps.tolist(), sched.sigmas.tolist()

    @torch.no_grad()
    def encode(self, request: GenerationRequest, pool) -> RequestState | None:
        """Text encoding, seeded initial latents and the sigma schedule into pages of
        ``pool``; ``None`` (nothing allocated) when the pool has no room."""
        check_request(request, self.multiple)
        if self.estimate_pages(request, pool.page_bytes) > pool.num_free_pages:
            return None  # do not run the text encoder for nothing
        p, cfg = self.pipe, self._uses_cfg(request)
        state = RequestState(pool, request_id=request.request_id or None)
        prompts = {"cond": request.prompt}
        if cfg:
            prompts["uncond"] = request.negative_prompt
        txt_rows = {}
        for branch, prompt in prompts.items():
            embeds, mask = p.encode_prompt(
                prompt=prompt, device=self.device, max_sequence_length=self.max_sequence_length
            )
            txt_rows[branch] = embeds.shape[1] if mask is None else int(mask.bool().sum())
            if not self._put(state, f"prompt_embeds.{branch}", embeds):
                return None
            if mask is not None and not self._put(state, f"prompt_mask.{branch}", mask):
                return None
        latents = p.prepare_latents(
            1, self.channels // 4, request.height, request.width, self.dtype, self.device,
            torch.Generator("cpu").manual_seed(request.seed),
        )
        if not self._put(state, "latents", latents):
            return None
        timesteps, sigmas = self._schedule(latents.shape[1], request.num_inference_steps)
        vae = p.vae_scale_factor
        state.scalars.update(
            step=0,
            block=0,
            txt_rows=txt_rows,
            timesteps=timesteps,
            sigmas=sigmas,
            cfg=cfg,
            cfg_scale=float(request.guidance_scale),
            height=request.height,
            width=request.width,
            img_shape=(1, request.height // vae // 2, request.width // vae // 2),
        )
        return state

    def boundary_pages(self, request: GenerationRequest, page_bytes: int) -> int:
        """Extra pages a request holds while paused inside a step (pure arithmetic plus
        tokenizing the prompts)."""
        check_request(request, self.multiple)
        dim = self.adapter.model.inner_dim
        tokens = (request.height // self.multiple) * (request.width // self.multiple)
        prompts = [request.prompt] + ([request.negative_prompt] if self._uses_cfg(request) else [])
        return sum(
            pages_for(tokens * dim, (), self.dtype, page_bytes)
            + pages_for(self._text_len(prompt) * dim, (), self.dtype, page_bytes)
            for prompt in prompts
        )

    @torch.no_grad()
    def open_step(self, states: list[RequestState]) -> OpenStep:
        """Embed the states' current step into one packed batch at the block they are at:
        the inputs at block 0, the boundary rows from their pages otherwise. No block
        runs."""
        check_step_states(states, self.is_done)
        start = common_block(states, self.num_blocks)
        latents = [s.get("latents") for s in states]
        kwargs, owners = [], []
        for s, lat in zip(states, latents, strict=True):
            for branch in qs.branches(s):
                kwargs.append(qs.forward_kwargs(s, lat, branch))
                owners.append((s, branch))
        dim = self.adapter.model.inner_dim
        boundary = None if start == 0 else [qs.load_boundary(s, b, dim) for s, b in owners]
        batch = self.adapter.prepare(kwargs, boundary, start)
        return OpenStep(list(states), start, latents, [(self.adapter, owners, batch)])

    def _finish_step(self, state: RequestState, latents: torch.Tensor,
                     preds: list[torch.Tensor]) -> None:
        """Free the boundary rows, then true-CFG combination and Euler update of
        ``latents`` ``[1, S, C]`` from ``preds`` (per branch) into the pages."""
        qs.drop_boundary(state)
        state.put("latents", qs.solver_update(state, latents, preds))
        state.scalars["step"] += 1

    def save_boundary(self, step: OpenStep) -> None:
        """Write an open step's boundary rows into the states' reserved pages (a park);
        states freed meanwhile are skipped."""
        ((_, owners, batch),) = step.groups
        for (s, branch), (img, txt) in zip(owners, batch.boundary(), strict=True):
            if qs.boundary_names(branch)[0] in s:
                qs.save_boundary(s, branch, img, txt)
        mark_boundary([s for s in step.states if s.scalars], True)

    def _boundary_shapes(self, state: RequestState) -> dict[str, tuple[int, int]]:
        return qs.boundary_shapes(state, self.adapter.model.inner_dim)

    def is_done(self, state: RequestState) -> bool:
        return state.scalars["step"] >= len(state.scalars["timesteps"])

    def progress(self, state: RequestState) -> tuple[int, int]:
        return state.scalars["step"], len(state.scalars["timesteps"])

    def latents(self, state: RequestState) -> torch.Tensor:
        """The state's current packed latents ``[1, S, C]`` (a copy)."""
        return state.get("latents")

    @torch.no_grad()
    def decode(self, state: RequestState) -> np.ndarray:
        """VAE-decode a finished state to ``uint8 [H, W, 3]``."""
        check_finished(state, self.progress(state))
        return decode_latents(self.pipe, state.get("latents"), state.scalars["height"],
                              state.scalars["width"])

    # ---------------------------------------------------------------- oracle
    @torch.no_grad()
    def reference(self, request: GenerationRequest, output: str = "image"):
        """The stock pipeline's ``__call__`` (unpatched processors) for ``request``:
        ``uint8 [H, W, 3]``, or with ``output="latents"`` the final packed latents."""
        check_request(request, self.multiple)
        if output not in ("image", "latents"):
            raise ValueError(f"reference: output must be 'image' or 'latents', got {output!r}")
        cfg = self._uses_cfg(request)
        with original_processors([self.adapter]):
            return run_pipeline(
                self.pipe, request, cfg, self.max_sequence_length, latents=output == "latents"
            )
