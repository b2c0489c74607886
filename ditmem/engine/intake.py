"""The thread-safe side of the engine: submissions and cancellations from other threads.

``Intake`` is the only state shared between the server threads and the engine thread; every
method takes its lock. The engine thread drains it at the top of each iteration.
"""

from __future__ import annotations

import threading

from ditmem.engine.jobs import Job
from ditmem.engine.stats import EngineStats


class Intake:
    """New jobs and cancel requests waiting for the engine thread, plus the published stats
    snapshot and progress of live jobs (read by other threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.new: list[Job] = []
        self.cancels: list[tuple[str, str]] = []
        self.live: dict[str, Job] = {}
        self.queued = 0
        self.stats = EngineStats()
        self.draining = False
        self.stopping = False
        self.dead: str | None = None
        self.signals = 0

    def push(self, job: Job, max_queued: int) -> bool:
        """Queue a job unless ``max_queued`` jobs are already waiting; False when full."""
        with self.lock:
            if self.queued >= max_queued:
                self.stats.rejected += 1
                return False
            self.new.append(job)
            self.live[job.id] = job
            self.queued += 1
            self.wake.notify()
            return True

    def cancel(self, request_id: str, reason: str) -> bool:
        """Ask the engine to drop a request; False if it is unknown or already finished."""
        with self.lock:
            if request_id not in self.live:
                return False
            self.cancels.append((request_id, reason))
            self.wake.notify()
            return True

    def wants_stop(self, request_ids) -> bool:
        """True when one of ``request_ids`` has a cancel waiting or the engine is stopping
        (the engine thread checks this between blocks of a long step)."""
        with self.lock:
            if self.stopping:
                return True
            ids = set(request_ids)
            return any(job_id in ids for job_id, _ in self.cancels)

    def take(self) -> tuple[list[Job], list[tuple[str, str]]]:
        """Everything submitted or cancelled since the last call (engine thread)."""
        with self.lock:
            new, cancels = self.new, self.cancels
            self.new, self.cancels = [], []
            return new, cancels

    def signal(self) -> None:
        """Wake the engine thread for an event outside the intake (a decode finished)."""
        with self.lock:
            self.signals += 1
            self.wake.notify()

    def wait(self, timeout: float | None) -> None:
        """Block the engine thread until something arrives or ``timeout`` passes."""
        with self.lock:
            if not (self.new or self.cancels or self.stopping or self.signals or self.dead):
                self.wake.wait(timeout)
            self.signals = 0

    def forget(self, job: Job, *, started: bool) -> None:
        """A job finished (any outcome). ``started`` False when it left while still queued."""
        with self.lock:
            self.live.pop(job.id, None)
            if not started:
                self.queued -= 1

    def started(self, n: int = 1) -> None:
        with self.lock:
            self.queued -= n

    def publish(self, stats: EngineStats) -> None:
        with self.lock:
            stats.draining = self.draining
            stats.dead = self.dead
            stats.rejected = self.stats.rejected
            stats.queued = self.queued
            self.stats = stats

    def snapshot(self) -> EngineStats:
        with self.lock:
            s = self.stats.copy()
            s.queued, s.draining, s.dead = self.queued, self.draining, self.dead
            return s
