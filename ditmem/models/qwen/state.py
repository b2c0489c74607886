"""How a Qwen-Image request lives in a ``ditmem.memory.RequestState`` between steps.

Tensors (``<branch>`` is ``cond``, plus ``uncond`` when true CFG runs):

* ``latents`` ``[1, S_img, C]`` — packed latents (the pipeline's layout);
* ``prompt_embeds.<branch>`` ``[1, L, D]`` and ``prompt_mask.<branch>`` ``[1, L]`` (only when
  the pipeline produced a mask);
* ``boundary.hidden.<branch>`` ``[S_img, dim]`` and ``boundary.encoder_hidden.<branch>``
  ``[S_txt_valid, dim]`` — only while paused inside a step (``scalars["block"] > 0``).

Scalars: ``step``, ``block`` (next transformer block; 0 between steps), ``timesteps``,
``sigmas`` (python floats holding the exact float32 values), ``cfg``, ``cfg_scale``,
``height``, ``width``, ``img_shape``, ``txt_rows`` (valid text rows per branch).
"""

from __future__ import annotations

import torch

from ditmem.memory import RequestState
from ditmem.models.common.open_step import CURRENT, read_boundary, write_boundary

BRANCHES = ("cond", "uncond")


def branches(state: RequestState) -> tuple[str, ...]:
    return BRANCHES if state.scalars["cfg"] else BRANCHES[:1]


def forward_kwargs(state: RequestState, latents: torch.Tensor, branch: str) -> dict:
    """Batch-1 ``QwenImageTransformer2DModel.forward`` kwargs of one CFG branch, built as
    the pipeline builds them (timestep = schedule value cast to the latents' dtype / 1000)."""
    t = state.scalars["timesteps"][state.scalars["step"]]
    timestep = torch.tensor([t], dtype=torch.float32, device=latents.device).to(latents.dtype)
    mask = f"prompt_mask.{branch}"
    return dict(
        hidden_states=latents,
        timestep=timestep / 1000,
        encoder_hidden_states=state.get(f"prompt_embeds.{branch}"),
        encoder_hidden_states_mask=state.get(mask) if mask in state else None,
        img_shapes=[[state.scalars["img_shape"]]],
    )


def boundary_names(branch: str) -> tuple[str, str]:
    return f"boundary.hidden.{branch}", f"boundary.encoder_hidden.{branch}"


def boundary_shapes(state: RequestState, dim: int) -> dict[str, tuple[int, int]]:
    """Shapes of the boundary tensors a state needs while paused inside a step."""
    h, w = state.scalars["img_shape"][1:]
    shapes = {}
    for branch in branches(state):
        hidden, encoder_hidden = boundary_names(branch)
        shapes[hidden] = (h * w, dim)
        shapes[encoder_hidden] = (state.scalars["txt_rows"][branch], dim)
    return shapes


def save_boundary(state: RequestState, branch: str, img: torch.Tensor, txt: torch.Tensor):
    """Write one branch's boundary rows into its reserved pages
    (:func:`ditmem.models.common.open_step.reserve_boundaries` first)."""
    for name, value in zip(boundary_names(branch), (img, txt), strict=True):
        write_boundary(state, name, value)


def load_boundary(state: RequestState, branch: str, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One branch's (image rows ``[S_img, dim]``, text rows ``[S_txt, dim]``) from pages."""
    hidden, encoder_hidden = boundary_names(branch)
    return read_boundary(state, hidden, dim), read_boundary(state, encoder_hidden, dim)


def drop_boundary(state: RequestState) -> None:
    for branch in branches(state):
        for name in boundary_names(branch):
            if name in state:
                state.delete(name)
    state.scalars.pop(CURRENT, None)


def solver_update(state: RequestState, latents: torch.Tensor, preds: list[torch.Tensor]):
    """True-CFG combination (norm-rescaled, as the pipeline does) and the flow-match Euler
    step ``x + (sigma_next - sigma) * v`` in float32, cast back to the prediction's dtype."""
    noise = preds[0]
    if state.scalars["cfg"]:
        cond, uncond = preds
        comb = uncond + state.scalars["cfg_scale"] * (cond - uncond)
        noise = comb * (torch.norm(cond, dim=-1, keepdim=True)
                        / torch.norm(comb, dim=-1, keepdim=True))
    i, sigmas = state.scalars["step"], state.scalars["sigmas"]
    sigma = torch.tensor(sigmas[i], dtype=torch.float32, device=latents.device)
    sigma_next = torch.tensor(sigmas[i + 1], dtype=torch.float32, device=latents.device)
    return (latents.to(torch.float32) + (sigma_next - sigma) * noise).to(noise.dtype)
