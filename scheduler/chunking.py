"""Block-level preemption: how many transformer blocks a step runs between preemption points,
and what pausing a part-done step costs.

A step of a packed batch runs as chunks of ``k`` blocks; after each chunk the engine asks the
policy again, so an urgent arrival waits at most one chunk instead of one step. Two costs set
``k`` (both from the cost model):

* every preemption point costs ``chunk_overhead_s`` (a sync and a decision) whether or not it
  preempts: chunks must be long enough that this stays under ``budget`` of the compute;
* resuming a parked step costs restoring its block-boundary activations over the host link:
  a chunk shorter than that restore would shorten the wait by less than a resume costs.

So ``k = clamp(max(⌈o / (budget·b)⌉, ⌈restore / b⌉), 1, blocks)`` with ``b`` the time of one
block of this batch; ``k = blocks`` means the step is not worth splitting (short image steps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .cost import CostModel
from .request import Request

#: Largest fraction of compute the preemption points may cost (the issue's 3 % overall limit
#: leaves room for transfers).
DEFAULT_CHUNK_BUDGET = 0.01


def activation_bytes(cost: CostModel, members: Sequence[Request]) -> int:
    """Bytes a part-done step of ``members`` parks (sum over the batch)."""
    return sum(cost.activation_bytes(r) for r in members)


def choose_chunk(
    cost: CostModel, members: Sequence[Request], budget: float = DEFAULT_CHUNK_BUDGET
) -> int:
    """Blocks per chunk for a packed step of ``members`` (all one model), in 1 … blocks."""
    if not members:
        raise ValueError("choose_chunk: members must name at least one request")
    if not 0 < budget < 1:
        raise ValueError(f"choose_chunk: budget must be in (0, 1), got {budget}")
    model = members[0].model
    blocks = cost.blocks(model)
    block_s = cost.step_time(model, [cost.tokens(r) for r in members]) / blocks
    if block_s <= 0:
        return blocks
    restore_s = cost.transfer_time(activation_bytes(cost, members))
    k = max(
        math.ceil(cost.chunk_overhead() / (budget * block_s) - 1e-9),
        math.ceil(restore_s / block_s - 1e-9),
        1,
    )
    return min(k, blocks)


def remaining_step_time(cost: CostModel, members: Sequence[Request], blocks_done: int) -> float:
    """Seconds left of a packed step of ``members`` that has run ``blocks_done`` blocks."""
    model = members[0].model
    left = cost.blocks(model) - blocks_done
    return cost.chunk_time(model, [cost.tokens(r) for r in members], left)
