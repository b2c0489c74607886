"""A denoising step kept open between chunks of blocks, and the pages of its boundary.

When a step runs as chunks of blocks (block-level preemption), consecutive chunks of the
same requests continue the packed batches in memory (:class:`OpenStep`): no re-embedding
of the inputs, no round trip of the block-boundary activations through pages. The boundary
is written to the requests' pages only when the step is paused for real (a park), and
read back from pages only when a paused step resumes. Pages for it are *reserved*
(allocated, not written) by the first chunk that ends inside the step, so a park never
needs new pages.

Whether a state's boundary pages hold its current rows is the state's scalar
``boundary_current``; a step resumed from pages checks it, so an open step that was never
written cannot be resumed from stale pages by mistake.

Boundary tensors are stored flat (``[rows * cols]``, no row shape), as ``pages_for(rows *
cols, ())`` counts them in each generator's ``boundary_pages``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ditmem.memory import RequestState, pages_for
from ditmem.models.common.generator import check_block_range, check_step_states

#: Scalar saying whether the state's boundary pages hold its current boundary rows.
CURRENT = "boundary_current"


@dataclass(slots=True, eq=False)
class OpenStep:
    """A part-done step whose packed batches live in memory between chunks.

    states: the requests (all at ``block``); block: the next block to run; latents: each
    state's latents as read when the step opened; groups: per transformer in use,
    ``(adapter, owners, batch)`` with ``owners[i] = (state, branch)`` the owner of the
    batch's i-th request; finished: the step's last block has run (solver updates done).
    """

    states: list[RequestState]
    block: int
    latents: list[torch.Tensor]
    groups: list[tuple[Any, list[tuple[RequestState, str]], Any]]
    finished: bool = False

    def continues(self, states: list[RequestState]) -> bool:
        """Whether running ``states`` next continues this step (same requests, any order,
        none moved on)."""
        return (not self.finished and len(states) == len(self.states)
                and {id(s) for s in states} == {id(s) for s in self.states}
                and all(s.scalars.get("block") == self.block for s in states))


def begin_advance(step: OpenStep, stop: int, num_blocks: int,
                  is_done: Callable[[RequestState], bool],
                  shapes: Callable[[RequestState], dict[str, tuple[int, int]]],
                  dtype: torch.dtype) -> bool:
    """Check that ``step``'s states can run blocks ``step.block .. stop-1`` (ValueError
    otherwise) and, when ``stop`` is inside the step, reserve their boundary pages; False
    (nothing changed) when a pool has no room."""
    check_step_states(step.states, is_done)
    if check_block_range(step.states, stop, num_blocks) != step.block:
        raise ValueError(f"advance: states are not at the open step's block {step.block}")
    return stop >= num_blocks or reserve_boundaries(step.states, shapes, dtype)


def run_open_blocks(step: OpenStep, stop: int, num_blocks: int) -> bool:
    """Run every packed batch of ``step`` through blocks ``step.block .. stop-1``. True when
    ``stop`` is inside the step (it stays open: the states are at block ``stop`` and their
    boundary pages do not hold these rows yet); False when the step's last block has run."""
    for adapter, _, batch in step.groups:
        adapter.run_blocks(batch, step.block, stop)
    step.block = stop
    if stop < num_blocks:
        for s in step.states:
            s.scalars["block"] = stop
        mark_boundary(step.states, False)
        return True
    return False


def step_predictions(step: OpenStep) -> dict[int, list[torch.Tensor]]:
    """The transformer outputs of a step whose last block has run, per state (by ``id``),
    in branch order."""
    preds: dict[int, list[torch.Tensor]] = {id(s): [] for s in step.states}
    for adapter, owners, batch in step.groups:
        for (s, _), out in zip(owners, adapter.finish(batch), strict=True):
            preds[id(s)].append(out)
    return preds


def run_step_blocks(generator, states: list[RequestState], stop: int) -> bool:
    """``step_blocks`` for a generator with ``open_step``/``advance``/``save_boundary``: run
    blocks up to ``stop`` and, inside the step, save the boundary into the pages. False
    (nothing changed) when a pool has no room for the boundary."""
    step = generator.open_step(states)
    if not generator.advance(step, stop):
        return False
    if not step.finished:
        generator.save_boundary(step)
    return True


def reserve_boundaries(states: list[RequestState],
                       shapes: Callable[[RequestState], dict[str, tuple[int, int]]],
                       dtype: torch.dtype) -> bool:
    """Allocate (uninitialised) every boundary tensor ``shapes(state)`` names that a state
    does not hold yet. ``False`` with nothing allocated when a pool lacks the pages."""
    missing = [(s, name, rows * cols) for s in states
               for name, (rows, cols) in shapes(s).items() if name not in s]
    need: dict[int, int] = {}
    for s, _, numel in missing:
        need[id(s.pool)] = need.get(id(s.pool), 0) + pages_for(numel, (), dtype,
                                                               s.pool.page_bytes)
    pools = {id(s.pool): s.pool for s in states}
    if any(n > pools[k].num_free_pages for k, n in need.items()):
        return False
    for s, name, numel in missing:
        paged = s.pool.allocate_tensor(numel, (), dtype)
        if paged is None:  # counted above; a pool shrinking meanwhile is a bug elsewhere
            raise RuntimeError(f"reserve_boundaries: pool lost its free pages for {name}")
        s.put(name, paged)
    return True


def write_boundary(state: RequestState, name: str, rows: torch.Tensor) -> None:
    """Write boundary rows ``[S, cols]`` into the reserved tensor ``name``."""
    state.paged(name).write(rows.reshape(-1))


def read_boundary(state: RequestState, name: str, cols: int) -> torch.Tensor:
    """Boundary rows of tensor ``name`` as ``[S, cols]`` (a copy); ``ValueError`` when the
    pages do not hold the current rows (the step is open in a ChunkRunner)."""
    if not state.scalars.get(CURRENT, True):
        raise ValueError(
            f"{state.request_id}: paused at block {state.scalars.get('block')} but its boundary "
            "rows are not in its pages (its step is open in a ChunkRunner: park or flush it)"
        )
    return state.get(name).view(-1, cols)


def mark_boundary(states: list[RequestState], current: bool) -> None:
    """Record whether the states' boundary pages hold their current rows."""
    for s in states:
        s.scalars[CURRENT] = current
