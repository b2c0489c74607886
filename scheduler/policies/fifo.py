"""``fifo``: run to completion in arrival order, one request at a time (vllm-omni's default)."""

from __future__ import annotations

from ..plan import SchedulerView, StepPlan
from .base import Policy


class FifoPolicy(Policy):
    """The oldest started request runs until it finishes; then the oldest waiting one starts."""

    name = "fifo"

    def schedule(self, now: float, view: SchedulerView) -> StepPlan:
        started = sorted(view.active, key=lambda s: (s.request.arrival, s.id))
        head = view.waiting.first("arrival")
        return self.plan_first_fit(view, started + ([head] if head is not None else []))
