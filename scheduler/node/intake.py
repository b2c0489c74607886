"""What reaches the node loop from outside it: arrivals, cancellations, lost devices.

``run_node`` reads every event through a ``NodeIntake``. A replay hands it a whole trace
(:class:`TraceIntake`: arrivals known in advance, the loop waits for the next one; nothing
is cancelled, no device is lost); a live server hands it a thread-safe intake its request
handlers feed (``ditmem.parallel.intake.LiveIntake``: arrival times unknown in advance,
the devices' ``wait`` returns early when one comes). Both go through the same loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..request import Request
from ..simulator import arrivals


class NodeIntake(Protocol):
    """Events from outside the node loop (see the module docstring). ``model``: the one
    model every request is for (the loop sizes the device pools for it)."""

    model: str

    def take(self, now: float) -> list[Request]:
        """Requests arrived by ``now`` and not taken yet, in arrival order, each with a
        deadline."""

    def next_arrival(self) -> float | None:
        """When the next request arrives, where that is known (None: unknown or none)."""

    def closed(self) -> bool:
        """True when no request will arrive any more (the loop ends once it is idle)."""

    def now(self) -> float:
        """The time on the devices' clock (read after ``wait`` returned early, with no
        completion and no known arrival: an arrival, a cancel or a lost device woke it)."""

    def cancelled(self) -> list[str]:
        """Ids whose cancellation was asked since the last call."""

    def dropped(self, request_id: str, started: bool) -> None:
        """The loop let a cancelled request go (``started``: its state held pages, which
        the intake's owner frees on the devices)."""

    def lost(self) -> int:
        """Mask of devices that are gone: the loop never hands them work again."""


class TraceIntake:
    """A whole trace as a ``NodeIntake``: requests in arrival order (ties by id), each
    without a deadline given ``slo_scale`` × its standalone time by ``cost``."""

    def __init__(self, requests: Sequence[Request], cost, slo_scale: float) -> None:
        self.pending = arrivals(requests, cost, slo_scale, "a node runs")
        self.model = self.pending[0].model if self.pending else ""
        self.next = 0

    def take(self, now: float) -> list[Request]:
        start = self.next
        while self.next < len(self.pending) and self.pending[self.next].arrival <= now:
            self.next += 1
        return self.pending[start:self.next]

    def next_arrival(self) -> float | None:
        return self.pending[self.next].arrival if self.next < len(self.pending) else None

    def closed(self) -> bool:
        return self.next >= len(self.pending)

    def now(self) -> float:
        raise RuntimeError("TraceIntake.now: a replay's devices never wake early")

    def cancelled(self) -> list[str]:
        return []

    def dropped(self, request_id: str, started: bool) -> None:
        raise RuntimeError(f"TraceIntake.dropped({request_id!r}): a trace cancels nothing")

    def lost(self) -> int:
        return 0
