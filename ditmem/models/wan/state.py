"""How a Wan request lives in a ``ditmem.memory.RequestState`` between steps (and between
chunks of blocks inside a step).

Tensors (``<branch>`` is ``cond``, plus ``uncond`` when CFG runs; ``<expert>`` is
``transformer`` or, for Wan2.2 A14B, ``transformer_2``):

* ``latents [1, C, F, H, W]`` float32, as the pipeline keeps them;
* ``solver.model_outputs.<k>``, ``solver.last_sample`` — UniPC history
  (:mod:`ditmem.models.wan.solver`);
* ``cross_kv.<expert>.<branch>.<group>`` — cached text K/V pages
  (:mod:`ditmem.models.wan.kv_cache`), or ``prompt_embeds.<branch> [1, L, text_dim]`` when
  the generator recomputes K/V;
* ``boundary.hidden.<branch> [S, dim]`` — only while paused inside a step
  (``scalars["block"] > 0``): the hidden rows after ``block`` transformer blocks. RoPE,
  modulation and text K/V are recomputed or cached, so nothing else is needed to resume.

Scalars: ``step``, ``block``, ``num_steps``, ``cfg``, ``guidance_scale``, ``experts`` (the
transformer of every step), ``text_len``, ``height``, ``width``, ``num_frames``, ``tokens``
(video tokens per branch), plus the solver's (see wan/solver.py).
"""

from __future__ import annotations

import torch

from ditmem.memory import RequestState
from ditmem.models.common.open_step import CURRENT, read_boundary, write_boundary

BRANCHES = ("cond", "uncond")


def branches(state: RequestState) -> tuple[str, ...]:
    """The CFG branches the request runs."""
    return BRANCHES if state.scalars["cfg"] else BRANCHES[:1]


def expert(state: RequestState) -> str:
    """The transformer the request's current step uses."""
    return state.scalars["experts"][state.scalars["step"]]


def boundary_name(branch: str) -> str:
    return f"boundary.hidden.{branch}"


def boundary_shapes(state: RequestState, dim: int) -> dict[str, tuple[int, int]]:
    """``(rows, cols)`` of each boundary tensor the state holds while paused in a step."""
    return {boundary_name(b): (state.scalars["tokens"], dim) for b in branches(state)}


def save_boundary(state: RequestState, branch: str, hidden: torch.Tensor) -> None:
    """Write one branch's hidden rows ``[S, dim]`` into its reserved pages
    (:func:`ditmem.models.common.open_step.reserve_boundaries` first)."""
    write_boundary(state, boundary_name(branch), hidden)


def load_boundary(state: RequestState, branch: str, dim: int) -> torch.Tensor:
    """One branch's hidden rows ``[S, dim]`` from its pages."""
    return read_boundary(state, boundary_name(branch), dim)


def drop_boundary(state: RequestState) -> None:
    """Free the boundary rows (after the step finished)."""
    for branch in branches(state):
        if boundary_name(branch) in state:
            state.delete(boundary_name(branch))
    state.scalars.pop(CURRENT, None)
