"""``srtf``: shortest remaining time first, preemptive at step boundaries, one at a time."""

from __future__ import annotations

from ..plan import SchedulerView, StepPlan
from .base import Policy


class SrtfPolicy(Policy):
    """Each step goes to the request (started or waiting) with the least predicted work left.

    Waiting requests have their full standalone time left, so only the smallest waiting one
    can win; ties go to the earlier arrival.
    """

    name = "srtf"

    def schedule(self, now: float, view: SchedulerView) -> StepPlan:
        best, best_key = None, None
        for s in view.active:
            key = (self.remaining(s.request, s.steps_done), s.request.arrival)
            if best_key is None or key < best_key:
                best, best_key = s, key
        head = view.waiting.first("size")
        if head is not None:
            key = (self.remaining(head), head.arrival)
            if best_key is None or key < best_key:
                best = head
        return self.plan_single(view, best)
