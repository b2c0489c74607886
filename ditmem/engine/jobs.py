"""The engine's record of one request, from submission to result."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ditmem.engine.results import Ticket
from ditmem.engine.timing import Timing
from ditmem.models.common.request import GenerationRequest


class Phase(str, Enum):
    """Where a job is in its life. WAITING: queued, no pages; ACTIVE: encoded, state in
    pages (device or host); DONE: result or error delivered, pages released."""

    WAITING = "waiting"
    ACTIVE = "active"
    DONE = "done"


@dataclass(slots=True)
class Job:
    """One submitted request: what was asked (``gen`` for the model, ``sched`` the
    scheduler's ``Request``), its pages (``state``, a ``RequestState`` while ACTIVE), the
    scheduler's ``status`` (a ``RequestStatus`` while ACTIVE), timing, the most pages its
    state held (``peak_pages``, device or host) and the ticket whose future gets the
    result."""

    gen: GenerationRequest
    sched: Any
    ticket: Ticket
    timing: Timing
    pages_needed: int
    phase: Phase = Phase.WAITING
    state: Any = None
    status: Any = None
    cancel_reason: str | None = None
    peak_pages: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.gen.request_id
