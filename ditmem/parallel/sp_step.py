"""A whole denoising step at sequence-parallel degree > 1, on states whose latents are
token-sharded (:mod:`ditmem.parallel.state_moves`): Qwen-Image here, Wan in
:func:`ditmem.parallel.wan_sp.sharded_step`.

Each device runs :func:`ditmem.parallel.qwen_sp.prepare_shard` on its latent rows, the
adapter's blocks, and the per-token solver update (true-CFG norm rescaling is per token,
the Euler step elementwise) on those rows only: no gather at the end of the step.
"""

from __future__ import annotations

import torch

from ditmem.models.common.generator import check_step_states
from ditmem.models.qwen import state as qs
from ditmem.parallel.qwen_sp import prepare_shard


@torch.no_grad()
def sharded_step(gen, states, group, rank: int, degree: int) -> None:
    """One step of ``states`` (all between steps, latents sharded for ``rank`` of
    ``degree``) on the process group ``group``."""
    kind = type(getattr(gen, "adapter", None)).__name__
    if kind == "WanAdapter":
        from ditmem.parallel import wan_sp

        return wan_sp.sharded_step(gen, states, group, rank, degree)
    if kind != "QwenAdapter":
        raise ValueError(f"sharded_step: degree {degree} steps are implemented for Qwen-Image "
                         f"and Wan generators, not {type(gen).__name__}")
    check_step_states(states, gen.is_done)
    for s in states:
        if s.scalars["block"]:
            raise ValueError(f"sharded_step: {s.request_id} is paused inside a step; only "
                             "whole steps run at degree > 1")
    latents = [s.get("latents") for s in states]
    kwargs, owners = [], []
    for s, lat in zip(states, latents, strict=True):
        for branch in qs.branches(s):
            kwargs.append(qs.forward_kwargs(s, lat, branch))
            owners.append(s)
    adapter = gen.adapter
    batch = prepare_shard(adapter, kwargs, group, rank, degree)
    adapter.run_blocks(batch, 0, adapter.num_blocks)
    preds: dict[int, list[torch.Tensor]] = {id(s): [] for s in states}
    for s, out in zip(owners, adapter.finish(batch), strict=True):
        preds[id(s)].append(out)
    for s, lat in zip(states, latents, strict=True):
        s.put("latents", qs.solver_update(s, lat, preds[id(s)]))
        s.scalars["step"] += 1
