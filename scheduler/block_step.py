"""One iteration of the simulated engine under block-level preemption.

A step runs as chunks of transformer blocks; between chunks the policy decides again. This
module applies a plan's chunk: it checks that a part-done step continues as the same batch,
parks the part-done step the plan leaves out (``parking.Parking``: async offload overlapping
the next compute), restores a resumed one before its chunk, and advances block counters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .chunking import activation_bytes
from .cost import CostModel
from .parking import ParkError
from .plan import StepPlan
from .request import Request, RequestStatus


class BlockPlanError(RuntimeError):
    """A plan broke a block-preemption rule (names it); the simulator re-raises it."""


@dataclass(slots=True)
class ChunkOutcome:
    """What one chunk cost: ``wait_s`` (restore or synchronous park before compute),
    ``compute_s`` (the blocks), ``overhead_s`` (the preemption point after them, if inside
    the step), blocks run, and the members whose step completed with this chunk."""

    wait_s: float
    compute_s: float
    overhead_s: float
    blocks: int
    stepped: list[RequestStatus]
    parked: list[str]


def part_done_groups(active: dict[str, RequestStatus]) -> dict[tuple[str, ...], list]:
    """Part-done steps among the started requests, by group."""
    groups: dict[tuple[str, ...], list] = {}
    for s in active.values():
        if s.blocks_done > 0:
            groups.setdefault(s.step_group, []).append(s)
    return groups


def run_chunk(
    eng,
    plan: StepPlan,
    members: list[RequestStatus],
    model: str,
    truth: CostModel,
    chunk_blocks: Callable[[list[Request]], int],
    t_start: float,
) -> ChunkOutcome:
    """Apply ``plan``'s chunk on ``eng`` (the simulator's engine) from ``t_start`` (after the
    plan's synchronous page moves). ``chunk_blocks`` is the policy's choice of k."""
    groups = part_done_groups(eng.active)
    batch = tuple(plan.batch)
    resumed: tuple[str, ...] | None = None
    for s in members:
        if s.blocks_done > 0:
            resumed = s.step_group
            break
    if resumed is not None and set(batch) != set(resumed):
        raise BlockPlanError(
            f"batch {list(batch)} must be exactly the part-done step {list(resumed)}"
        )
    if plan.blocks is not None and plan.blocks < 1:
        raise BlockPlanError(f"plan.blocks must be >= 1, got {plan.blocks}")
    wait, parked = 0.0, []
    for group, statuses in groups.items():
        if group == resumed or eng.parking.location(group) is not None:
            continue
        nbytes = activation_bytes(truth, [s.request for s in statuses])
        try:
            wait += eng.parking.park(group, nbytes, t_start, eng)
        except ParkError as exc:
            raise BlockPlanError(str(exc)) from exc
        for s in statuses:
            eng.parks[s.id] = eng.parks.get(s.id, 0) + 1
        parked += list(group)
    if resumed is not None and eng.parking.location(resumed) is not None:
        wait += eng.parking.resume(resumed, t_start + wait, eng)
    for group in list(eng.parking.parked):
        loc = eng.parking.location(group)
        for rid in group:
            if rid in eng.active:
                eng.active[rid].activations = loc
    for rid in resumed or ():
        eng.active[rid].activations = None
    if not members:
        return ChunkOutcome(wait, 0.0, 0.0, 0, [], parked)
    total = truth.blocks(model)
    done = members[0].blocks_done
    k = plan.blocks if plan.blocks is not None else chunk_blocks([s.request for s in members])
    k = min(k, total - done)
    tokens = [truth.tokens(s.request) for s in members]
    compute = truth.chunk_time(model, tokens, k)
    overhead = truth.chunk_overhead() if done + k < total else 0.0
    group = tuple(sorted(s.id for s in members))
    stepped = []
    for s in members:
        s.blocks_done = done + k
        s.step_group = group
        if s.blocks_done == total:
            s.blocks_done, s.step_group = 0, ()
            stepped.append(s)
    return ChunkOutcome(wait, compute, overhead, k, stepped, parked)
