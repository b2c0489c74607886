"""The live side of the node loop: a thread-safe ``NodeIntake`` that request handlers
feed while ``run_node`` runs (``ditmem.scheduler.node.intake``).

Handlers call :meth:`LiveIntake.push` / :meth:`cancel` / :meth:`close` from any thread;
each call wakes the loop (``wake``: the devices' ``notify``, which makes their ``wait``
return early), so the loop never polls. A replay feeds the same intake from a thread that
pushes each trace request at its arrival time (:func:`feed_trace`): serving and replaying
run one loop on one path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from ditmem.scheduler import Request


class IntakeClosed(RuntimeError):
    """A request was pushed after :meth:`LiveIntake.close`."""


class LiveIntake:
    """Requests arriving while the loop runs (see module docstring).

    model: the scheduler's model key of every request; clock: the devices' clock (the
    loop's time axis, seconds); wake: called after every push, cancel, close or loss;
    on_dropped(request_id, started): the loop let a cancelled request go (``started``: it
    held pages, to free on the devices).
    """

    def __init__(self, model: str, clock: Callable[[], float], wake: Callable[[], None],
                 on_dropped: Callable[[str, bool], None] | None = None) -> None:
        self.model = model
        self.clock = clock
        self.wake = wake
        self.on_dropped = on_dropped
        self._lock = threading.Lock()
        self._new: list[Request] = []
        self._cancels: list[str] = []
        self._closed = False
        self._lost = 0

    # ------------------------------------------------------------------ any thread
    def push(self, request: Request) -> None:
        """Queue ``request`` (its deadline assigned; ``arrival`` on the devices' clock)."""
        if request.deadline is None:
            raise ValueError(f"push: request {request.id!r} has no deadline")
        if request.model != self.model:
            raise ValueError(f"push: request {request.id!r} is for {request.model!r}, this "
                             f"node serves {self.model!r}")
        with self._lock:
            if self._closed:
                raise IntakeClosed("the node takes no new requests (shutting down)")
            self._new.append(request)
        self.wake()

    def cancel(self, request_id: str) -> bool:
        """Ask the loop to drop ``request_id`` (running: after its job). True when it had
        not reached the loop yet (removed here: the loop never sees it)."""
        with self._lock:
            kept = [r for r in self._new if r.id != request_id]
            removed = len(kept) < len(self._new)
            if not removed:
                self._cancels.append(request_id)
            self._new = kept
        self.wake()
        return removed

    def close(self) -> None:
        """No more pushes; the loop ends once what it has is done."""
        with self._lock:
            self._closed = True
        self.wake()

    def mark_lost(self, device: int) -> None:
        """``device`` is gone: the loop stops handing it work."""
        with self._lock:
            self._lost |= 1 << device
        self.wake()

    # ------------------------------------------------------------------ the loop (NodeIntake)
    def take(self, now: float) -> list[Request]:
        with self._lock:
            new, self._new = self._new, []
        return sorted(new, key=lambda r: (r.arrival, r.id))

    def next_arrival(self) -> float | None:
        return None  # live arrivals are not known in advance: ``wake`` says when one comes

    def closed(self) -> bool:
        with self._lock:
            return self._closed and not self._new

    def now(self) -> float:
        return self.clock()

    def cancelled(self) -> list[str]:
        with self._lock:
            out, self._cancels = self._cancels, []
        return out

    def dropped(self, request_id: str, started: bool) -> None:
        if self.on_dropped is not None:
            self.on_dropped(request_id, started)

    def lost(self) -> int:
        with self._lock:
            return self._lost


def feed_trace(intake: LiveIntake, trace: Sequence[Request],
               stop: threading.Event | None = None) -> threading.Thread:
    """Start a thread pushing each request of ``trace`` (deadlines assigned, arrivals on
    the intake's clock) when its arrival comes, then closing the intake (or at ``stop``)."""
    stop = stop if stop is not None else threading.Event()

    def run() -> None:
        try:
            for r in sorted(trace, key=lambda r: (r.arrival, r.id)):
                while not stop.is_set():
                    ahead = r.arrival - intake.now()
                    if ahead <= 0:
                        break
                    stop.wait(min(ahead, 0.5))
                if stop.is_set():
                    return
                intake.push(r)
        finally:
            intake.close()

    thread = threading.Thread(target=run, name="ditmem-trace-feed", daemon=True)
    thread.start()
    return thread
