"""Counters and gauges of a running engine (read by ``/metrics`` and the demo)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(slots=True)
class EngineStats:
    """A snapshot. Gauges: ``queued`` (waiting to start), ``running`` (active, state on the
    device), ``paused`` (active and not in the last step batch), ``offloaded`` (state on the
    host), page counts of both pools. Counters (since start): bytes moved each way,
    ``preemptions`` (a request that stepped in one iteration and not in the next while
    unfinished), ``steps`` (packed step batches), ``iterations`` and ``schedule_s`` (time
    spent in ``policy.schedule``), finished requests by outcome, and SLO
    met/missed per priority 0/1/2 among completed requests; ``dead``: why the engine
    stopped serving after a failure it could not survive (None while healthy)."""

    queued: int = 0
    running: int = 0
    paused: int = 0
    offloaded: int = 0
    pages_used: int = 0
    pages_free: int = 0
    host_pages_used: int = 0
    bytes_offloaded: int = 0
    bytes_restored: int = 0
    preemptions: int = 0
    steps: int = 0
    iterations: int = 0
    schedule_s: float = 0.0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    rejected: int = 0
    slo_met: list[int] = field(default_factory=lambda: [0, 0, 0])
    slo_missed: list[int] = field(default_factory=lambda: [0, 0, 0])
    draining: bool = False
    dead: str | None = None

    def copy(self) -> EngineStats:
        return replace(self, slo_met=list(self.slo_met), slo_missed=list(self.slo_missed))
