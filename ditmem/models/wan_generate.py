"""Step-decomposed Wan text-to-video generation (the
:class:`~ditmem.models.generator.Generator` protocol) on a stock ``WanPipeline`` whose
transformer(s) are patched.

Every stage reuses the pipeline's own pieces so that a run equals ``pipeline.__call__``:
``encode_prompt`` (prompts padded to ``max_sequence_length``), ``prepare_latents`` with
``torch.Generator("cpu").manual_seed(seed)``, the pipeline scheduler's configuration for the
UniPC schedule (per-request history: :mod:`ditmem.models.wan_solver`), the Wan2.2 expert
switch at ``boundary_ratio``, and the pipeline's de-normalisation, VAE and postprocessing.

State of a request (``RequestState`` names): ``latents [1, C, F, H, W]`` (float32, as the
pipeline keeps them); the solver history (see wan_solver); cross-attention K/V per expert
and CFG branch ``cross_kv.<expert>.<branch>.<group>`` (computed once at encode; the text
embeddings themselves are not kept) — or, with ``cache_cross_kv=False``,
``prompt_embeds.<branch>`` and K/V recomputed every step. Scalars: ``step``,
``num_steps``, ``cfg``, ``guidance_scale``, ``experts``, ``text_len``, ``height``,
``width``, ``num_frames``.

One ``step`` runs one packed forward per transformer in use (Wan2.1 and Wan2.2 5B: always
one; Wan2.2 A14B: the high-noise and low-noise expert each get one when the batch holds
requests on both sides of the boundary), CFG branches as extra segments.

Equivalence with the stock pipeline: attention runs through ``ditmem.ops.paged_attention``
(not SDPA) and the requests share GEMMs, so latents match to a relative error of about
1e-6 on the tiny model (tests assert <= 1e-4) and decoded uint8 frames to within 1 level,
not bit for bit. Against itself the path is deterministic: the same states stepped in the
same groups give bit-identical latents whether or not they were offloaded and restored in
between (into other pages).
"""

from __future__ import annotations

import numpy as np
import torch

from ditmem.memory import RequestState, pages_for
from ditmem.models.qwen_generate import to_uint8
from ditmem.models.request import GenerationRequest
from ditmem.models.wan import WanAdapter
from ditmem.models.wan_kv_cache import WanCrossKV, geometry_of
from ditmem.models.wan_solver import SolverSchedules, init_solver, solver_order, unipc_step

CFG = ("cond", "uncond")
EXPERTS = ("transformer", "transformer_2")


class WanGenerator:
    """Generator for ``WanPipeline`` (see module docstring). Attributes: ``pipe``, ``name``,
    ``adapter`` (the first transformer's), ``adapters`` (per expert), ``device``, ``dtype``."""

    def __init__(self, pipe, name: str = "tiny-wan", max_sequence_length: int = 512,
                 cache_cross_kv: bool = True) -> None:
        if pipe.transformer is None:
            raise ValueError("pipe: a WanPipeline without .transformer is not supported")
        if pipe.config.expand_timesteps:
            raise ValueError("pipe: expand_timesteps (Wan2.2 TI2V) pipelines are not supported")
        self.pipe = pipe
        self.name = name
        self.adapters = {e: WanAdapter(getattr(pipe, e)) for e in EXPERTS
                         if getattr(pipe, e, None) is not None}
        self.adapter = self.adapters["transformer"]
        self.device = pipe.transformer.device
        self.dtype = pipe.transformer.dtype
        self.max_sequence_length = max_sequence_length
        self.cache_cross_kv = cache_cross_kv
        self.schedules = SolverSchedules(pipe.scheduler, self.device)
        ratio = pipe.config.boundary_ratio
        self.boundary = None if ratio is None else ratio * pipe.scheduler.config.num_train_timesteps

    @classmethod
    def load(cls, name_or_path: str = "tiny-wan", device: str | torch.device = "cpu",
             dtype: torch.dtype = torch.float32, seed: int = 0, two_experts: bool = False,
             **kwargs) -> WanGenerator:
        """``"tiny-wan"`` builds the embedded pipeline (weights from ``seed``; ``two_experts``
        adds a Wan2.2-A14B-like second transformer); a folder with ``model_index.json``
        loads real weights with ``WanPipeline.from_pretrained``. kwargs go to ``__init__``."""
        if name_or_path == "tiny-wan":
            from ditmem.models.wan_tiny import build_pipeline

            pipe = build_pipeline(seed=seed, dtype=dtype, device=str(device),
                                  two_experts=two_experts)
        else:
            from diffusers import WanPipeline

            pipe = WanPipeline.from_pretrained(name_or_path, torch_dtype=dtype).to(device)
            pipe.set_progress_bar_config(disable=True)
        return cls(pipe, name=name_or_path, **kwargs)

    # ---------------------------------------------------------------- requests
    def _check(self, request: GenerationRequest) -> None:
        p = self.pipe
        multiple = p.vae_scale_factor_spatial * p.transformer.config.patch_size[1]
        for name in ("width", "height"):
            v = getattr(request, name)
            if v <= 0 or v % multiple:
                raise ValueError(f"request.{name}: must be a positive multiple of {multiple}, "
                                 f"got {v}")
        temporal = p.vae_scale_factor_temporal
        if request.num_frames < 1 or request.num_frames % temporal != 1:
            raise ValueError(f"request.num_frames: must be {temporal}k+1 (1, {temporal + 1}, "
                             f"{2 * temporal + 1}, ...), got {request.num_frames}")
        if request.num_inference_steps < 1:
            raise ValueError("request.num_inference_steps: must be >= 1, got "
                             f"{request.num_inference_steps}")

    def _latent_shape(self, request: GenerationRequest) -> tuple[int, ...]:
        p = self.pipe
        s = p.vae_scale_factor_spatial
        frames = (request.num_frames - 1) // p.vae_scale_factor_temporal + 1
        return (1, p.transformer.config.in_channels, frames, request.height // s,
                request.width // s)

    def _experts(self, timesteps: list[float]) -> list[str]:
        """The transformer each step uses (the pipeline's boundary rule)."""
        if self.boundary is None:
            return ["transformer"] * len(timesteps)
        return ["transformer" if t >= self.boundary else "transformer_2" for t in timesteps]

    def _branches(self, request: GenerationRequest) -> tuple[str, ...]:
        return CFG if request.guidance_scale > 1.0 else CFG[:1]

    def estimate_pages(self, request: GenerationRequest, page_bytes: int) -> int:
        """Pages of ``page_bytes`` that :meth:`encode` allocates for ``request`` (exact)."""
        self._check(request)
        numel = int(np.prod(self._latent_shape(request)))
        order = solver_order(self.pipe.scheduler)
        total = (2 + order) * pages_for(numel, (), torch.float32, page_bytes)
        branches = len(self._branches(request))
        if not self.cache_cross_kv:
            dim = self.pipe.transformer.config.text_dim
            per = pages_for(self.max_sequence_length * dim, (), self.dtype, page_bytes)
            return total + branches * per
        timesteps = self.schedules.timesteps(request.num_inference_steps).tolist()
        for expert in sorted(set(self._experts(timesteps))):
            geo = geometry_of(self.adapters[expert].model, page_bytes)
            total += branches * geo.pages(self.max_sequence_length)
        return total

    # ---------------------------------------------------------------- stages
    @torch.no_grad()
    def encode(self, request: GenerationRequest, pool) -> RequestState | None:
        """Text encoding (and cross-attention K/V), seeded initial latents and a fresh solver
        into pages of ``pool``; ``None`` (nothing left allocated) when the pool has no room."""
        self._check(request)
        p, branches = self.pipe, self._branches(request)
        cond, uncond = p.encode_prompt(
            prompt=request.prompt, negative_prompt=request.negative_prompt,
            do_classifier_free_guidance=len(branches) == 2, num_videos_per_prompt=1,
            max_sequence_length=self.max_sequence_length, device=self.device)
        embeds = dict(zip(CFG, (cond.to(self.dtype), None if uncond is None
                                else uncond.to(self.dtype)), strict=True))
        timesteps = self.schedules.timesteps(request.num_inference_steps).tolist()
        experts = self._experts(timesteps)
        state = RequestState(pool, request_id=request.request_id or None)
        if not self._store_text(state, embeds, branches, sorted(set(experts))):
            return None
        latents = p.prepare_latents(
            1, p.transformer.config.in_channels, request.height, request.width,
            request.num_frames, torch.float32, self.device,
            torch.Generator("cpu").manual_seed(request.seed))
        if state.put("latents", latents) is None or not init_solver(state, p.scheduler, latents):
            state.free()
            return None
        state.scalars.update(
            num_steps=request.num_inference_steps, cfg=len(branches) == 2,
            guidance_scale=float(request.guidance_scale), experts=experts,
            text_len=cond.shape[1], height=request.height, width=request.width,
            num_frames=request.num_frames)
        return state

    def _store_text(self, state: RequestState, embeds: dict, branches, experts) -> bool:
        for branch in branches:
            if not self.cache_cross_kv:
                if state.put(f"prompt_embeds.{branch}", embeds[branch]) is None:
                    state.free()
                    return False
                continue
            for expert in experts:
                kv = self.adapters[expert].cache_cross_kv(embeds[branch], state.pool)
                if kv is None:
                    state.free()
                    return False
                for g, tensor in enumerate(kv.tensors):
                    state.put(f"cross_kv.{expert}.{branch}.{g}", tensor)
        return True

    def _cross_kv(self, state: RequestState, expert: str, branch: str) -> WanCrossKV:
        """The request's cache as a :class:`WanCrossKV` over its current pages."""
        model = self.adapters[expert].model
        geo = geometry_of(model, state.pool.page_bytes)
        tensors = [state.paged(f"cross_kv.{expert}.{branch}.{g}") for g in range(len(geo.groups))]
        return WanCrossKV(tensors, geo, state.scalars["text_len"], model)

    def _kwargs(self, state: RequestState, latents: torch.Tensor, expert: str,
                branch: str) -> dict:
        t = self.schedules.timesteps(state.scalars["num_steps"])[state.scalars["step"]]
        kw = dict(hidden_states=latents.to(self.dtype), timestep=t.expand(1))
        if self.cache_cross_kv:
            kw["cross_kv"] = self._cross_kv(state, expert, branch)
        else:
            kw["encoder_hidden_states"] = state.get(f"prompt_embeds.{branch}")
        return kw

    @torch.no_grad()
    def step(self, states: list[RequestState]) -> None:
        """One packed forward per transformer in use over all states (CFG branches as extra
        segments), then each request's guidance and UniPC update, written back to pages."""
        self._check_states(states)
        latents = [s.get("latents") for s in states]
        jobs: dict[str, list[tuple[int, dict]]] = {}
        for i, (s, lat) in enumerate(zip(states, latents, strict=True)):
            expert = s.scalars["experts"][s.scalars["step"]]
            for branch in CFG[: 2 if s.scalars["cfg"] else 1]:
                jobs.setdefault(expert, []).append((i, self._kwargs(s, lat, expert, branch)))
        preds: list[list[torch.Tensor]] = [[] for _ in states]
        for expert, items in jobs.items():
            outs = self.adapters[expert].forward_packed([kw for _, kw in items])
            for (i, _), out in zip(items, outs, strict=True):
                preds[i].append(out)
        for s, lat, pred in zip(states, latents, preds, strict=True):
            noise = pred[0]
            if s.scalars["cfg"]:
                noise = pred[1] + s.scalars["guidance_scale"] * (pred[0] - pred[1])
            schedule = self.schedules.get(s.scalars["num_steps"])
            s.put("latents", unipc_step(schedule, s, noise, lat))

    def _check_states(self, states: list[RequestState]) -> None:
        if not states:
            raise ValueError("step: states is empty")
        if len({id(s) for s in states}) != len(states):
            raise ValueError("step: the same state appears twice")
        for i, s in enumerate(states):
            if self.is_done(s):
                raise ValueError(f"step: states[{i}] ({s.request_id}) has already finished")
            if s.location != "device":
                raise ValueError(f"step: states[{i}] ({s.request_id}) is {s.location}; restore "
                                 "it to the device first")

    def is_done(self, state: RequestState) -> bool:
        """True when all the request's denoising steps have run."""
        return state.scalars["step"] >= state.scalars["num_steps"]

    def progress(self, state: RequestState) -> tuple[int, int]:
        """(steps done, steps total)."""
        return state.scalars["step"], state.scalars["num_steps"]

    def latents(self, state: RequestState) -> torch.Tensor:
        """The state's current latents ``[1, C, F, H, W]`` (a copy)."""
        return state.get("latents")

    @torch.no_grad()
    def decode(self, state: RequestState) -> np.ndarray:
        """VAE-decode a finished state to ``uint8 [F, H, W, 3]``."""
        if not self.is_done(state):
            done, total = self.progress(state)
            raise ValueError(f"decode: state {state.request_id} has run {done} of {total} steps")
        p = self.pipe
        x = state.get("latents").to(p.vae.device, p.vae.dtype)
        z = p.vae.config.z_dim
        mean = torch.tensor(p.vae.config.latents_mean).view(1, z, 1, 1, 1).to(x.device, x.dtype)
        inv_std = 1.0 / torch.tensor(p.vae.config.latents_std).view(1, z, 1, 1, 1).to(
            x.device, x.dtype)
        video = p.vae.decode(x / inv_std + mean, return_dict=False)[0]
        return to_uint8(p.video_processor.postprocess_video(video, output_type="np")[0])

    def release(self, state: RequestState) -> None:
        """Free the state's pages (idempotent)."""
        state.free()

    # ---------------------------------------------------------------- oracle
    @torch.no_grad()
    def reference(self, request: GenerationRequest, output: str = "video"):
        """The stock pipeline's ``__call__`` (original processors) for ``request``:
        ``uint8 [F, H, W, 3]``, or with ``output="latents"`` the final latents."""
        self._check(request)
        if output not in ("video", "latents"):
            raise ValueError(f"output: must be 'video' or 'latents', got {output!r}")
        for a in self.adapters.values():
            a.unpatch()
        try:
            frames = self.pipe(
                prompt=request.prompt, negative_prompt=request.negative_prompt,
                height=request.height, width=request.width, num_frames=request.num_frames,
                num_inference_steps=request.num_inference_steps,
                guidance_scale=request.guidance_scale,
                generator=torch.Generator("cpu").manual_seed(request.seed),
                max_sequence_length=self.max_sequence_length,
                output_type="latent" if output == "latents" else "np").frames
        finally:
            for a in self.adapters.values():
                a.repatch()
        return frames if output == "latents" else to_uint8(frames[0])
