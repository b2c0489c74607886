"""Which tensors of a request's state are sharded by tokens at sequence-parallel degree
> 1, and how they become token rows and back.

At degree 1 a state holds its tensors as the generator keeps them; at degree ``d > 1``
rank ``r`` holds rows ``shard(S, d, r)`` of each token-sharded tensor in *token-row
layout* ``[1, S, P]`` (one row per transformer token, the ``P`` values that token owns):

* Qwen-Image: the packed latents ``[1, S, C]`` are token rows already.
* Wan: the latents ``[1, C, F, H, W]`` and the UniPC history shaped like them
  (``solver.model_outputs.<k>``, ``solver.last_sample``); token ``(f, h, w)`` of the
  ``(p_t, p_h, p_w)`` patch grid owns ``P = p_t * p_h * p_w * C`` values, ordered as the
  transformer's output projection emits them (patch offsets, then channels), so the
  model's prediction rows need no unpatchify before the per-token solver update.

Both directions are pure permutations (exact).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: scalar recording, while a state is held at degree > 1, every token-sharded tensor's
#: degree-1 shape (what :meth:`TokenRows.from_rows` restores)
SHAPES = "sp.shapes"


@dataclass(frozen=True, slots=True)
class TokenRows:
    """The token-sharded tensors of one model's states (``names`` exactly, or any name
    starting with one of ``prefixes``) and the patch of a token (``None``: the tensors are
    token rows ``[1, S, P]`` already)."""

    names: tuple[str, ...]
    prefixes: tuple[str, ...] = ()
    patch: tuple[int, int, int] | None = None

    def sharded(self, name: str) -> bool:
        """True when tensor ``name`` is split by tokens at degree > 1."""
        return name in self.names or name.startswith(self.prefixes)

    def to_rows(self, value: torch.Tensor) -> torch.Tensor:
        """A degree-1 tensor as token rows ``[1, S, P]`` (a copy when the layout changes)."""
        if self.patch is None:
            return value
        if value.dim() != 5 or value.shape[0] != 1:
            raise ValueError(f"to_rows: expected [1, C, F, H, W], got {tuple(value.shape)}")
        _, c, f, h, w = value.shape
        pt, ph, pw = self.patch
        x = value.reshape(1, c, f // pt, pt, h // ph, ph, w // pw, pw)
        return x.permute(0, 2, 4, 6, 3, 5, 7, 1).reshape(
            1, (f // pt) * (h // ph) * (w // pw), pt * ph * pw * c)

    def from_rows(self, rows: torch.Tensor, shape) -> torch.Tensor:
        """All token rows ``[1, S, P]`` back to the degree-1 tensor of ``shape``."""
        shape = tuple(shape)
        if self.patch is None:
            return rows.reshape(shape)
        _, c, f, h, w = shape
        pt, ph, pw = self.patch
        x = rows.reshape(1, f // pt, h // ph, w // pw, pt, ph, pw, c)
        return x.permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(shape)


def rows_of(generator) -> TokenRows:
    """The token layout of ``generator``'s states; ValueError for a model whose states
    cannot be sharded (deterministic: every rank of a collective refuses alike)."""
    kind = type(getattr(generator, "adapter", None)).__name__
    if kind == "QwenAdapter":
        return TokenRows(("latents",))
    if kind == "WanAdapter":
        patch = tuple(generator.adapter.model.config.patch_size)
        return TokenRows(("latents", "solver.last_sample"), ("solver.model_outputs.",), patch)
    raise ValueError(f"sequence-parallel states are implemented for Qwen-Image and Wan; "
                     f"{type(generator).__name__} requests run at degree 1")
