"""One iteration of the simulated engine under block-level preemption.

A step runs as chunks of transformer blocks; between chunks the policy decides again. This
module applies a plan's chunk: it checks that a part-done step continues as the same batch,
parks the part-done step the plan leaves out (``parking.Parking``: async offload overlapping
the next compute), restores a resumed one before its chunk, and advances block counters.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
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


def part_done_groups(active: Iterable[RequestStatus]) -> dict[tuple[str, ...], list]:
    """Part-done steps among the started requests, by group: the sorted ids of the live
    members sharing a ``step_group`` (a member that left, e.g. cancelled, is not in it)."""
    shared: dict[tuple[str, ...], list] = {}
    for s in active:
        if s.blocks_done > 0:
            shared.setdefault(s.step_group, []).append(s)
    return {tuple(sorted(s.id for s in group)): group for group in shared.values()}


def plan_chunk(
    active: Iterable[RequestStatus],
    members: list[RequestStatus],
    parked: Container[tuple[str, ...]],
    blocks: int | None = None,
) -> tuple[list[tuple[tuple[str, ...], list[RequestStatus]]], tuple[str, ...] | None]:
    """The block-preemption rules for the next chunk of ``members`` (the batch), for the
    simulator and the engine alike: ``(to_park, resumed)``, the part-done steps to park
    first (group, statuses; ``parked`` holds those already parked) and the part-done step
    the batch continues (None: it starts a new step). Raises ``BlockPlanError`` when the
    batch is not exactly the part-done step a member is in, or ``blocks`` < 1."""
    groups = part_done_groups(active)
    resumed = None
    for s in members:
        if s.blocks_done > 0:
            resumed = next(g for g in groups if s.id in g)
            break
    ids = {s.id for s in members}
    if resumed is not None and ids != set(resumed):
        raise BlockPlanError(
            f"batch {[s.id for s in members]} must be exactly the part-done step {list(resumed)}"
        )
    if blocks is not None and blocks < 1:
        raise BlockPlanError(f"plan.blocks must be >= 1, got {blocks}")
    to_park = [(g, group) for g, group in groups.items() if g != resumed and g not in parked]
    return to_park, resumed


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
    to_park, resumed = plan_chunk(eng.active.values(), members, eng.parking.parked,
                                  plan.blocks)
    wait, parked = 0.0, []
    for group, statuses in to_park:
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
