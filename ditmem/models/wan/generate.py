"""Step-decomposed Wan text-to-video generation (the
:class:`~ditmem.models.common.generator.Generator` protocol) on a stock ``WanPipeline`` whose
transformer(s) are patched.

Every stage reuses the pipeline's own pieces so that a run equals ``pipeline.__call__``:
``encode_prompt`` (prompts padded to ``max_sequence_length``), ``prepare_latents`` with
``torch.Generator("cpu").manual_seed(seed)``, the pipeline scheduler's configuration for the
UniPC schedule (per-request history: :mod:`ditmem.models.wan.solver`), the Wan2.2 expert
switch at ``boundary_ratio``, and the pipeline's de-normalisation, VAE and postprocessing.

How a request lives in its ``RequestState`` (tensor names, scalars): :mod:`ditmem.models.
wan/state.py`. Cross-attention K/V are computed once at encode (the text embeddings are not
kept); ``cache_cross_kv=False`` keeps ``prompt_embeds`` and recomputes K/V every step.

``step_blocks`` runs a step in chunks of blocks; between chunks a request's hidden rows
sit in its pages, so it can be offloaded and resumed in other pages (``step`` = all blocks).
One ``step`` runs one packed forward per transformer in use (Wan2.1: always one; Wan2.2
A14B: the high-noise and low-noise expert each get one when the batch holds requests on
both sides of the boundary), CFG branches as extra segments. Wan2.2 TI2V pipelines
(``expand_timesteps``) and image-conditioned Wan are refused.

Equivalence with the stock pipeline: attention runs through ``ditmem.ops.paged_attention``
(not SDPA) and the requests share GEMMs, so latents match to a relative error of about
1e-6 on the tiny model (tests assert <= 1e-4) and decoded uint8 frames to within 1 level,
not bit for bit. The VAE's 3-D convolutions and RMS norms take faster CPU paths
(:mod:`ditmem.models.common.cpu_vae`), so the generator's ``pipe`` decodes within 1e-4
relative of an unpatched one (uint8 within one level). Against itself the path is
deterministic and batch-invariant (see wan/packed.py): a request's latents are
bit-identical whichever requests share its steps and whether or not it was offloaded and
restored in between (into other pages), on the same device, dtype and thread count.
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
from ditmem.models.common.request import GenerationRequest
from ditmem.models.wan import WanAdapter
from ditmem.models.wan import state as ws
from ditmem.models.wan.kv_cache import WanCrossKV, geometry_of
from ditmem.models.wan.pipeline import decode_latents, load_pipeline, run_reference
from ditmem.models.wan.shapes import WanShapes
from ditmem.models.wan.solver import SolverSchedules, init_solver, solver_order, unipc_step

CFG = ws.BRANCHES
EXPERTS = ("transformer", "transformer_2")


class WanGenerator(BlockStepGenerator):
    """Generator for ``WanPipeline`` (see module docstring). Attributes: ``pipe``, ``name``,
    ``adapter`` (the first transformer's), ``adapters`` (per expert), ``device``, ``dtype``.
    Steps: one packed forward per transformer in use, then each request's guidance and
    UniPC update; between chunks of blocks a request's hidden rows sit in its pages
    (``boundary.hidden.<branch>``)."""

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
        self.vae_patch = speed_up_vae(pipe.vae)  # CPU fast paths (cpu_vae)
        if len({a.num_blocks for a in self.adapters.values()}) != 1:
            raise ValueError("pipe: transformer and transformer_2 differ in block count")
        self.device = pipe.transformer.device
        self.dtype = pipe.transformer.dtype
        self.max_sequence_length = max_sequence_length
        self.cache_cross_kv = cache_cross_kv
        self.schedules = SolverSchedules(pipe.scheduler, self.device)
        self.shapes = WanShapes.of(pipe)
        ratio = pipe.config.boundary_ratio
        self.boundary = None if ratio is None else ratio * pipe.scheduler.config.num_train_timesteps

    @classmethod
    def load(cls, name_or_path: str = "tiny-wan", device: str | torch.device = "cpu",
             dtype: torch.dtype | str | None = None, seed: int = 0,
             two_experts: bool = False,
             **kwargs) -> WanGenerator:
        """``"tiny-wan"`` builds the embedded pipeline (weights from ``seed``; ``two_experts``
        adds a Wan2.2-A14B-like second transformer); a folder with ``model_index.json``
        loads real weights with ``WanPipeline.from_pretrained``. ``dtype``: see
        :func:`ditmem.models.load`. kwargs go to ``__init__``."""
        from ditmem.models.common.dtypes import resolve_dtype

        pipe = load_pipeline(name_or_path, device, resolve_dtype(dtype, device), seed,
                             two_experts)
        return cls(pipe, name=name_or_path, **kwargs)

    # ---------------------------------------------------------------- requests
    def _experts(self, timesteps: list[float]) -> list[str]:
        """The transformer each step uses (the pipeline's boundary rule)."""
        if self.boundary is None:
            return ["transformer"] * len(timesteps)
        return ["transformer" if t >= self.boundary else "transformer_2" for t in timesteps]

    def _branches(self, request: GenerationRequest) -> tuple[str, ...]:
        return CFG if request.guidance_scale > 1.0 else CFG[:1]

    def estimate_pages(self, request: GenerationRequest, page_bytes: int) -> int:
        """Pages of ``page_bytes`` that :meth:`encode` allocates for ``request`` (exact)."""
        self.shapes.check(request)
        numel = int(np.prod(self.shapes.latent_shape(request)))
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

    def state_bytes(self, request: GenerationRequest) -> int:
        """Bytes of tensor data :meth:`encode` stores for ``request`` (not rounded up to
        pages; for sizing pools and cost models independently of the page size)."""
        self.shapes.check(request)
        numel = int(np.prod(self.shapes.latent_shape(request)))
        total = (2 + solver_order(self.pipe.scheduler)) * numel * 4
        branches = len(self._branches(request))
        itemsize = self.dtype.itemsize
        if not self.cache_cross_kv:
            dim = self.pipe.transformer.config.text_dim
            return total + branches * self.max_sequence_length * dim * itemsize
        timesteps = self.schedules.timesteps(request.num_inference_steps).tolist()
        for expert in set(self._experts(timesteps)):
            cfg = self.adapters[expert].model.config
            per_token = cfg.num_layers * 2 * cfg.num_attention_heads * cfg.attention_head_dim
            total += branches * self.max_sequence_length * per_token * itemsize
        return total

    # ---------------------------------------------------------------- stages
    @torch.no_grad()
    def encode(self, request: GenerationRequest, pool) -> RequestState | None:
        """Text encoding (and cross-attention K/V), seeded initial latents and a fresh solver
        into pages of ``pool``; ``None`` (nothing left allocated) when the pool has no room."""
        self.shapes.check(request)
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
            1, self.shapes.channels, request.height, request.width,
            request.num_frames, torch.float32, self.device,
            torch.Generator("cpu").manual_seed(request.seed))
        if state.put("latents", latents) is None or not init_solver(state, p.scheduler, latents):
            state.free()
            return None
        state.scalars.update(
            num_steps=request.num_inference_steps, cfg=len(branches) == 2,
            guidance_scale=float(request.guidance_scale), experts=experts,
            text_len=cond.shape[1], height=request.height, width=request.width,
            num_frames=request.num_frames, block=0, tokens=self.shapes.tokens(request))
        return state

    def _store_text(self, state: RequestState, embeds: dict, branches, experts) -> bool:
        for branch in branches:
            if not self.cache_cross_kv:
                if not self._put(state, f"prompt_embeds.{branch}", embeds[branch]):
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

    def boundary_pages(self, request: GenerationRequest, page_bytes: int) -> int:
        """Extra pages a request holds while paused inside a step (pure arithmetic)."""
        self.shapes.check(request)
        numel = self.shapes.tokens(request) * self.shapes.inner_dim
        rows = pages_for(numel, (), self.dtype, page_bytes)
        return len(self._branches(request)) * rows

    @torch.no_grad()
    def open_step(self, states: list[RequestState]) -> OpenStep:
        """Embed the states' current step into packed batches (one per transformer in use)
        at the block they are at: the inputs at block 0, the boundary rows from their pages
        otherwise. No block runs."""
        check_step_states(states, self.is_done)
        start = common_block(states, self.num_blocks)
        latents = [s.get("latents") for s in states]
        jobs: dict[str, list[tuple[RequestState, str, dict]]] = {}
        for s, lat in zip(states, latents, strict=True):
            for branch in ws.branches(s):
                item = (s, branch, self._kwargs(s, lat, ws.expert(s), branch))
                jobs.setdefault(ws.expert(s), []).append(item)
        dim = self.shapes.inner_dim
        groups = []
        for expert, items in jobs.items():
            adapter = self.adapters[expert]
            owners = [(s, b) for s, b, _ in items]
            boundary = None if start == 0 else [ws.load_boundary(s, b, dim) for s, b in owners]
            groups.append((adapter, owners, adapter.prepare([kw for _, _, kw in items],
                                                            boundary, start)))
        return OpenStep(list(states), start, latents, groups)

    def _finish_step(self, state: RequestState, latents: torch.Tensor,
                     preds: list[torch.Tensor]) -> None:
        """Guidance from ``preds`` (per branch), free the boundary rows, then the UniPC
        update of ``latents`` ``[1, C, F, H, W]`` (float32) into the pages (it counts the
        step)."""
        noise = preds[0]
        if state.scalars["cfg"]:
            cond, uncond = preds
            noise = uncond + state.scalars["guidance_scale"] * (cond - uncond)
        ws.drop_boundary(state)
        schedule = self.schedules.get(state.scalars["num_steps"])
        state.put("latents", unipc_step(schedule, state, noise, latents))

    def save_boundary(self, step: OpenStep) -> None:
        """Write an open step's boundary rows into the states' reserved pages (a park);
        states freed meanwhile are skipped."""
        for _, owners, batch in step.groups:
            for (s, branch), rows in zip(owners, batch.boundary(), strict=True):
                if ws.boundary_name(branch) in s:
                    ws.save_boundary(s, branch, rows)
        mark_boundary([s for s in step.states if s.scalars], True)

    def _boundary_shapes(self, state: RequestState) -> dict[str, tuple[int, int]]:
        return ws.boundary_shapes(state, self.shapes.inner_dim)

    def is_done(self, state: RequestState) -> bool:
        """True when all the request's denoising steps have run."""
        return state.scalars["step"] >= state.scalars["num_steps"]

    def progress(self, state: RequestState) -> tuple[int, int]:
        """(steps done, steps total)."""
        return state.scalars["step"], state.scalars["num_steps"]

    def latents(self, state: RequestState) -> torch.Tensor:
        """The state's current latents ``[1, C, F, H, W]`` (a copy)."""
        return state.get("latents")

    def decode(self, state: RequestState) -> np.ndarray:
        """VAE-decode a finished state to ``uint8 [F, H, W, 3]``."""
        check_finished(state, self.progress(state))
        return decode_latents(self.pipe, state.get("latents"))

    # ---------------------------------------------------------------- oracle
    def reference(self, request: GenerationRequest, output: str = "video"):
        """The stock pipeline's ``__call__`` (original processors) for ``request``:
        ``uint8 [F, H, W, 3]``, or with ``output="latents"`` the final latents."""
        self.shapes.check(request)
        return run_reference(self.pipe, self.adapters.values(), request,
                             self.max_sequence_length, output)
