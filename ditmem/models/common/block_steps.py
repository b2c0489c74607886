"""Running a denoising step in chunks of transformer blocks: the part of the Qwen-Image and
Wan generators that is the same for both.

:class:`BlockStepGenerator` is their base class. It gives ``num_blocks``, ``block``,
``step``, ``step_blocks``, ``advance`` and ``release`` (see
:mod:`ditmem.models.common.generator` for what each means) on top of what each model
provides itself:

* ``adapter`` (its ``num_blocks``: blocks per step, the same for every transformer in use)
  and ``dtype`` (of the boundary rows);
* ``is_done(state)``, ``open_step(states)``, ``save_boundary(step)``;
* ``_boundary_shapes(state) -> {name: (rows, cols)}``, the boundary tensors a state holds
  while paused inside a step;
* ``_finish_step(state, latents, preds)``, the end of a step for one request: free its
  boundary rows, combine its branch predictions (guidance) and write the solver-updated
  latents (and step counter) back into its pages.

The block counter lives in ``state.scalars["block"]`` (0 between steps).
"""

from __future__ import annotations

from typing import Any

import torch

from ditmem.memory import RequestState
from ditmem.models.common.open_step import (
    OpenStep,
    begin_advance,
    run_open_blocks,
    run_step_blocks,
    step_predictions,
)


class BlockStepGenerator:
    """Base class of the generators whose steps can pause between transformer blocks (see
    module docstring for what a subclass provides)."""

    adapter: Any
    dtype: torch.dtype

    @property
    def num_blocks(self) -> int:
        """Transformer blocks per step (the finest preemption grain of ``step_blocks``)."""
        return self.adapter.num_blocks

    def block(self, state: RequestState) -> int:
        """Next transformer block of the current step (0 between steps)."""
        return state.scalars["block"]

    def step(self, states: list[RequestState]) -> None:
        """One packed forward per transformer in use over all states (CFG branches as extra
        segments), then each request's guidance and solver update (``_finish_step``),
        written back to pages. States paused inside a step (all at the same block) finish
        that step."""
        self.step_blocks(states, self.num_blocks)

    def step_blocks(self, states: list[RequestState], stop: int) -> bool:
        """Run transformer blocks ``block .. stop-1`` of the current step for all states
        (which must all be at the same ``block``) in one packed pass. ``stop ==
        num_blocks`` finishes the step (guidance, solver update, boundary pages freed);
        otherwise the boundary activations are saved into the states' pages, so a request
        can be offloaded and resumed in any pages. Returns ``False`` with nothing changed
        when a pool has no room for them.
        (:class:`~ditmem.models.common.chunked.ChunkRunner` keeps the step open between chunks
        instead: :meth:`open_step`, :meth:`advance`, :meth:`save_boundary`.)"""
        return run_step_blocks(self, states, stop)

    @torch.no_grad()
    def advance(self, step: OpenStep, stop: int) -> bool:
        """Run blocks ``step.block .. stop-1`` of an open step. Stopping inside the step
        reserves the states' boundary pages (``False``, nothing changed, when a pool has no
        room) but writes nothing; ``stop == num_blocks`` finishes the step (guidance,
        solver update, boundary pages freed)."""
        if not begin_advance(step, stop, self.num_blocks, self.is_done,
                             self._boundary_shapes, self.dtype):
            return False
        if run_open_blocks(step, stop, self.num_blocks):
            return True
        preds = step_predictions(step)
        for s, lat in zip(step.states, step.latents, strict=True):
            self._finish_step(s, lat, preds[id(s)])
            s.scalars["block"] = 0
        step.finished = True
        return True

    def release(self, state: RequestState) -> None:
        """Free the state's pages (idempotent)."""
        state.free()

    @staticmethod
    def _put(state: RequestState, name: str, value: torch.Tensor) -> bool:
        """Store ``value`` as tensor ``name`` of ``state``; when the pool has no room, free
        all of the state's pages and return ``False``."""
        if state.put(name, value) is None:
            state.free()
            return False
        return True

    # What each model provides (see module docstring).
    def is_done(self, state: RequestState) -> bool:
        raise NotImplementedError

    def _boundary_shapes(self, state: RequestState) -> dict[str, tuple[int, int]]:
        raise NotImplementedError

    def _finish_step(self, state: RequestState, latents: torch.Tensor,
                     preds: list[torch.Tensor]) -> None:
        raise NotImplementedError
