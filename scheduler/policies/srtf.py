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
        keyed = [
            ((self.remaining(s.request, s.steps_done, s.blocks_done), s.request.arrival), s)
            for s in view.active
        ]
        head = view.waiting.first("size")
        if head is not None:
            keyed.append(((self.remaining(head), head.arrival), head))
        keyed.sort(key=lambda pair: pair[0])
        return self.plan_first_fit(view, [item for _, item in keyed])
