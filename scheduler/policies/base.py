"""What every policy offers, and the plan-building helpers they share."""

from __future__ import annotations

from ..chunking import DEFAULT_CHUNK_BUDGET, choose_chunk
from ..cost import CostModel
from ..plan import SchedulerView, StepPlan, StepReport
from ..request import Location, Request, RequestStatus


class Policy:
    """Base class: ``schedule(now, view) -> StepPlan`` each iteration, ``observe(report)`` after.

    A policy is built once per engine/simulation with the cost model it predicts with and
    may keep state between iterations (it sees every iteration in order).
    """

    name = "base"
    #: Largest fraction of compute that preemption points between blocks may cost.
    chunk_budget = DEFAULT_CHUNK_BUDGET
    #: Blocks per chunk fixed by the user (None: chosen from the cost model).
    fixed_chunk: int | None = None

    def __init__(self, cost: CostModel):
        self.cost = cost

    def schedule(self, now: float, view: SchedulerView) -> StepPlan:
        """Decide what happens in the next iteration (``now``: seconds, engine clock)."""
        raise NotImplementedError

    def observe(self, report: StepReport) -> None:
        """Learn from what the engine measured (default: feed the cost model)."""
        self.cost.observe(report)

    # ---- helpers ----------------------------------------------------------------------
    def remaining(self, request: Request, steps_done: int = 0, blocks_done: int = 0) -> float:
        """Predicted seconds the request still needs alone."""
        return self.cost.remaining_time(request, steps_done, blocks_done)

    def chunk_blocks(self, members: list[Request]) -> int:
        """Blocks to run before the next preemption point, for a packed step of ``members``
        (block-level preemption; see ``ditmem.scheduler.chunking``)."""
        if self.fixed_chunk is not None:
            return min(self.fixed_chunk, self.cost.blocks(members[0].model))
        return choose_chunk(self.cost, members, self.chunk_budget)

    def plan_first_fit(self, view: SchedulerView, choices) -> StepPlan:
        """A plan that runs the first of ``choices`` (started RequestStatus or waiting Request,
        best first) that can be made to fit for one step: a waiting request is admitted if its
        pages fit (offloading paused requests, latest deadline first, when needed) and the
        engine's ``max_active`` allows; a request on the host is restored likewise. Returns an
        empty plan when none fits."""
        plan = StepPlan()
        for chosen in choices:
            if make_room(self.cost, view, [chosen], plan):
                break
        return self.with_pause(plan, view)

    @staticmethod
    def with_pause(plan: StepPlan, view: SchedulerView) -> StepPlan:
        """Fill ``plan.pause`` with the last batch's ids that are still active and not rerun."""
        running = set(plan.batch)
        active = {s.id for s in view.active}
        plan.pause = [i for i in view.last_batch if i in active and i not in running]
        return plan


def _latest_deadline_first(status: RequestStatus) -> tuple:
    return (-(status.request.deadline or 0.0), status.request.priority)


def make_room(
    cost: CostModel,
    view: SchedulerView,
    members: list,
    plan: StepPlan,
    victim_order=_latest_deadline_first,
) -> bool:
    """Add ``members`` (RequestStatus or waiting Request) to ``plan.batch``, with the admits,
    restores and offloads that need; paused device-resident requests are offloaded in
    ``victim_order`` (a sort key) until the pages fit. Returns False, leaving the plan
    unchanged, when they cannot fit (device and host full) or an admit would exceed
    ``view.max_active``."""
    page_bytes = view.memory.page_bytes
    need = 0
    admits, restores = [], []
    for m in members:
        if isinstance(m, RequestStatus):
            if m.location is Location.HOST:
                need += m.pages
                restores.append(m.id)
        else:
            need += cost.pages_for(m, page_bytes)
            admits.append(m.id)
    if admits and view.max_active is not None:
        if len(view.active) + len(plan.admit) + len(admits) > view.max_active:
            return False
    free = view.memory.free_pages + plan_freed_pages(plan, view) - plan_used_pages(plan, view, cost)
    offloads: list[str] = []
    if need > free:
        keep = {m.id for m in members} | set(plan.batch) | set(plan.offload)
        victims = sorted(
            (s for s in view.active if s.location is Location.DEVICE and s.id not in keep),
            key=victim_order,
        )
        # Offloads run before restores (StepPlan order): the host must have room already.
        host_free = view.memory.host_free_pages - plan_freed_pages(plan, view)
        for s in victims:
            if need <= free:
                break
            if s.pages > host_free:
                continue
            offloads.append(s.id)
            free += s.pages
            host_free -= s.pages
        if need > free:
            return False
    plan.offload += offloads
    plan.restore += restores
    plan.admit += admits
    plan.batch += [m.id for m in members]
    return True


def plan_freed_pages(plan: StepPlan, view: SchedulerView) -> int:
    """Device pages the plan's offloads free."""
    ids = set(plan.offload)
    return sum(s.pages for s in view.active if s.id in ids)


def plan_used_pages(plan: StepPlan, view: SchedulerView, cost: CostModel) -> int:
    """Device pages the plan's restores and admits take."""
    restored = set(plan.restore)
    used = sum(s.pages for s in view.active if s.id in restored)
    for rid in plan.admit:
        used += cost.pages_for(view.waiting.get(rid), view.memory.page_bytes)
    return used
