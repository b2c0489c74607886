"""``slo``: deadline/slack- and priority-aware step scheduling (first cut: EDF, one at a time)."""

from __future__ import annotations

from ..plan import SchedulerView, StepPlan
from .base import Policy


class SloPolicy(Policy):
    """Earliest deadline first at step boundaries (refined in later commits)."""

    name = "slo"

    def schedule(self, now: float, view: SchedulerView) -> StepPlan:
        best, best_key = None, None
        for s in view.active:
            key = (s.request.deadline, s.request.arrival)
            if best_key is None or key < best_key:
                best, best_key = s, key
        head = view.waiting.first("deadline")
        if head is not None and (best_key is None or (head.deadline, head.arrival) < best_key):
            best = head
        return self.plan_single(view, best)
