"""A simulated replica the cluster simulation advances in steps: one node loop, fed live.

:func:`~.cluster.simulate_cluster` needs each replica's state at every report epoch, given
only the requests routed to it so far. Re-simulating from t = 0 at each epoch
(:class:`Resimulated`) costs the square of the requests; :class:`SteppedNode` runs the node
loop (``node.simulator.run_node``) once, in a thread, through its live interface: a
``NodeIntake`` the cluster feeds (``add``) and a wrapper of the virtual devices that holds
the loop at the cluster's horizon (``advance(t)``: the loop handles every event at or
before t, then waits; the cluster promises no arrival before t after that). The loop never
learns of an arrival before it comes, so the run is the one a whole trace would give — the
same decisions, the same noise draws (tested against :class:`Resimulated`).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .cluster import ReplicaRun
from .request import Request


@dataclass(slots=True)
class Held:
    """A request a replica holds at a report, not finished (``finished`` is +inf)."""

    request: Request
    finished: float = math.inf


class Resimulated:
    """A replica simulated anew, from t = 0, whenever its requests changed:
    ``run_replica(requests, index) -> ReplicaRun``."""

    def __init__(self, run_replica: Callable[[list[Request], int], ReplicaRun],
                 index: int) -> None:
        self.run_replica = run_replica
        self.index = index
        self.assigned: list[Request] = []
        self.run = ReplicaRun([])
        self.simulated = 0
        self.runs = 0

    def add(self, request: Request) -> None:
        self.assigned.append(request)

    def advance(self, t: float) -> ReplicaRun:
        if self.simulated != len(self.assigned):
            self.run = self.run_replica(list(self.assigned), self.index)
            self.simulated = len(self.assigned)
            self.runs += 1
        return self.run

    def finish(self) -> list:
        return self.run_replica(list(self.assigned), self.index).records if self.assigned \
            else []


@dataclass(slots=True)
class _Shared:
    queue: deque = field(default_factory=deque)
    horizon: float = 0.0
    reached: float = -math.inf
    closing: bool = False
    done: bool = False
    error: BaseException | None = None


class _Intake:
    """The node loop's ``NodeIntake``: requests the cluster routed here, and the horizon as
    the next time to look again while none is due before it."""

    def __init__(self, model: str, shared: _Shared, lock: threading.Condition) -> None:
        self.model = model
        self.s = shared
        self.lock = lock

    def take(self, now: float) -> list[Request]:
        with self.lock:
            out = []
            while self.s.queue and self.s.queue[0].arrival <= now:
                out.append(self.s.queue.popleft())
            return out

    def next_arrival(self) -> float | None:
        with self.lock:
            head = self.s.queue[0].arrival if self.s.queue else None
            if self.s.closing:
                return head
            return self.s.horizon if head is None else min(head, self.s.horizon)

    def closed(self) -> bool:
        with self.lock:
            return self.s.closing and not self.s.queue

    def now(self) -> float:
        raise RuntimeError("SteppedNode: the loop waits without a time only once closed")

    def cancelled(self) -> list[str]:
        return []

    def dropped(self, request_id: str, started: bool) -> None:
        raise RuntimeError(f"SteppedNode: nothing is cancelled ({request_id!r})")

    def lost(self) -> int:
        return 0


class _Held:
    """The virtual devices, held at the horizon: a wait that reaches it with nothing done
    before it tells the cluster and blocks until the horizon moves (or the run closes)."""

    def __init__(self, devices, shared: _Shared, lock: threading.Condition) -> None:
        self.devices = devices
        self.s = shared
        self.lock = lock

    def __getattr__(self, name):
        return getattr(self.devices, name)

    def launch(self, job, now: float) -> None:
        self.devices.launch(job, now)

    def wait(self, until: float | None):
        done = self.devices.wait(until)
        if done or until is None:
            return done
        with self.lock:
            if not self.s.closing and until >= self.s.horizon:
                self.s.reached = until
                self.lock.notify_all()
                self.lock.wait_for(lambda: self.s.closing or self.s.horizon > until)
        return []


class SteppedNode:
    """One node replica run once, in a thread, as the cluster feeds it.

    ``run(intake, devices, on_record)`` runs the node loop (``run_node`` with the policy,
    node and truth the caller built) and returns its result; ``devices``: the virtual
    devices to wrap; ``progress``: the policy's step log (``StepLog.progress``), read at
    each report. ``add`` requests in arrival order, never before the last ``advance``."""

    def __init__(self, run: Callable, model: str, devices,
                 progress: dict[str, list[tuple[float, int]]]) -> None:
        self.lock = threading.Condition()
        self.s = _Shared()
        self.progress = progress
        self.records: list = []
        self.held: dict[str, Request] = {}
        self._run = run
        self._intake = _Intake(model, self.s, self.lock)
        self._devices = _Held(devices, self.s, self.lock)
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.started = False

    def _main(self) -> None:
        try:
            self._run(self._intake, self._devices, self._record)
        except BaseException as exc:  # handed to the cluster's thread
            with self.lock:
                self.s.error = exc
        with self.lock:
            self.s.done = True
            self.lock.notify_all()

    def _record(self, rec) -> None:
        with self.lock:
            self.records.append(rec)
            self.held.pop(rec.request.id, None)

    def add(self, request: Request) -> None:
        if request.arrival < self.s.horizon:
            raise ValueError(f"add: {request.id!r} arrives at {request.arrival} before the "
                             f"horizon {self.s.horizon}")
        with self.lock:
            self.s.queue.append(request)
            self.held[request.id] = request
            self.lock.notify_all()

    def advance(self, t: float) -> ReplicaRun:
        """Run the loop through every event at or before ``t``; the replica's state then
        (finished records, held requests, steps done)."""
        if not self.started:
            self.thread.start()
            self.started = True
        with self.lock:
            if t > self.s.horizon:
                self.s.horizon = t
                self.lock.notify_all()
            self.lock.wait_for(lambda: self.s.done or self.s.reached >= t)
            self._check()
            records = list(self.records) + [Held(r) for r in self.held.values()]
        return ReplicaRun(records, self.progress)

    def finish(self) -> list:
        """Close the intake and run to the end: every record."""
        if not self.started:
            self.thread.start()
            self.started = True
        with self.lock:
            self.s.closing = True
            self.lock.notify_all()
        self.thread.join()
        self._check()
        return list(self.records)

    def _check(self) -> None:
        if self.s.error is not None:
            raise self.s.error
