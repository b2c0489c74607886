"""The engine: one thread running the step loop of ../DESIGN.md "Engine".

Each iteration: take new submissions and cancellations, show the policy a
``SchedulerView``, execute its ``StepPlan`` (offload -> restore -> admit/encode -> one packed
step -> decode the finished: ``ditmem.scheduler.loop.run_stages``, the order the simulator
runs too), record timings, hand results to the requests' futures. Other
threads only call :meth:`Engine.submit`, :meth:`cancel`, :meth:`stats`, :meth:`progress`,
:meth:`status`, :meth:`backlog_s`, :meth:`drain` and :meth:`stop`.

Health: an iteration that raises (outside one request's stage, which the executor already
confines to that request) is logged, the requests its plan held fail with
:class:`EngineFault` (503 to their clients, with the reason) and the loop goes on. A
failure it cannot survive — failing those requests raises too, or ``max_failures``
iterations in a row raise — marks the engine dead: every live request fails with
``EngineFault``, submissions raise ``EngineStopped``, ``stats().dead`` gives the reason.
"""

from __future__ import annotations

import logging
import threading
import time

from ditmem.engine.admission import check_standalone, pages_needed, scheduled, window_ms
from ditmem.engine.executor import PlanExecutor
from ditmem.engine.handoff import Handoff
from ditmem.engine.intake import Intake
from ditmem.engine.jobs import Job, Phase
from ditmem.engine.results import (
    EngineFault,
    EngineStopped,
    QueueFull,
    RequestCancelled,
    Ticket,
)
from ditmem.engine.timing import Timing
from ditmem.models.common.request import GenerationRequest

#: (tile, stride) pixels of a tiled decode when none is given.
DEFAULT_DECODE_TILE = (256, 224)
#: iterations in a row that may raise before the engine counts as dead
MAX_FAILURES = 3

log = logging.getLogger(__name__)
def check_decode(generator, decode: str, decode_workers: int, decode_tile) -> None:
    """ValueError for a decode setup the engine cannot run (names the setting)."""
    from ditmem.models.common.tiled_decode import supports_tiled_decode

    if decode not in ("inline", "tiled"):
        raise ValueError(f"decode: 'inline' or 'tiled', got {decode!r}")
    if decode_workers not in (0, 1):
        raise ValueError(f"decode_workers: 0 or 1, got {decode_workers} (the VAE keeps its "
                         "decode cache on the model object: two decodes at once would share it)")
    if decode == "tiled" and decode_workers:
        raise ValueError("decode 'tiled' runs tiles on the step loop: use decode_workers 0")
    if decode_tile is not None and not supports_tiled_decode(generator):
        raise ValueError(f"decode tiles: {type(generator).__name__} has no tiled decode "
                         "(supported: tiny-qwen-image and Qwen-Image weights)")


class Engine:
    """Serves one generator with one policy.

    ``generator``: a ``ditmem.models`` generator; ``policy``: a ``ditmem.scheduler`` policy
    (``schedule(view) -> StepPlan``); ``cost``: the ``CostModel`` (deadlines, and what the
    policy predicts with); ``pool``/``host``: the device ``PagePool`` and the ``HostPool``
    offload target; ``model``: the scheduler's model key (e.g. "qwen-image");
    ``max_active``: most started requests (running + paused) at once; ``max_queued``: most
    requests waiting to start before submit raises ``QueueFull``; ``decode_workers``: 0
    decodes on the engine thread right after the last step (what the simulator models),
    n > 0 decodes on n worker threads while the step loop goes on (the request keeps its
    pages until its output is delivered); ``preemption``: "step" (requests pause between
    steps) or "block" (steps run in chunks of blocks and may pause between them:
    :mod:`ditmem.engine.block_steps`); ``decode_tile``: (tile, stride) pixels to decode
    images in VAE tiles (the stock VAE's tiled decode; None: whole, as the stock pipeline
    by default); ``decode``: "inline" (the decode runs right after the last step) or
    "tiled" (one tile at a time on the loop, instead of a step when the decode is due
    first: :mod:`ditmem.engine.tiled_decodes`; ``decode_tile`` defaults to 256, 224).
    """

    def __init__(self, generator, policy, cost, pool, host, *, model: str = "qwen-image",
                 max_active: int = 64, max_queued: int = 256, clock=time.perf_counter,
                 offload_mode: str = "auto", idle_wait_s: float = 0.05,
                 slo_scale: float = 3.0, decode_workers: int = 0, preemption: str = "step",
                 decode: str = "inline", decode_tile: tuple[int, int] | None = None):
        if preemption not in ("step", "block"):
            raise ValueError(f"preemption: 'step' or 'block', got {preemption!r}")
        if decode == "tiled" and decode_tile is None:
            decode_tile = DEFAULT_DECODE_TILE
        check_decode(generator, decode, decode_workers, decode_tile)
        self.preemption = preemption
        self.gen, self.policy, self.cost = generator, policy, cost
        self._exact = cost if hasattr(cost, "register") else None
        self.pool, self.host, self.model = pool, host, model
        self.max_active, self.max_queued = max_active, max_queued
        self.clock = clock
        self.idle_wait_s = idle_wait_s
        self.slo_scale = slo_scale
        self.decode_workers = decode_workers
        self.decode = decode
        self.decode_tile = tuple(decode_tile) if decode_tile is not None else None
        self.max_failures = MAX_FAILURES
        self.intake = Intake()
        self.executor = PlanExecutor(self, offload_mode)
        self.handoff = Handoff(self)  # export/adopt parked requests (ditmem.engine.handoff)
        self._listeners: list = []
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ other threads
    def submit(self, request: GenerationRequest, *, priority: int = 1,
               slo_ms: float | None = None, arrival: float | None = None,
               max_standalone_s: float | None = None) -> Ticket:
        """Queue a request; returns its :class:`Ticket` at once. May tokenize the prompt
        (page estimate): call it off an event loop.

        Raises ``RequestTooLarge`` (its state needs more pages than the whole pool),
        ``InvalidRequest`` (the model's shape rules refuse it; names the field),
        ``TooSlow`` (the cost model's standalone estimate is over ``max_standalone_s``),
        ``QueueFull`` (``max_queued`` waiting; ``retry_after_s``: the backlog's seconds of
        work), ``EngineStopped`` (draining, stopped or dead) and ``ValueError`` for a
        missing request id.
        """
        if self.intake.dead is not None:
            raise EngineStopped(f"the engine is dead ({self.intake.dead}); restart the server")
        if self.intake.draining or self.intake.stopping:
            raise EngineStopped("the server is shutting down and takes no new requests")
        if not request.request_id:
            raise ValueError("request_id: must be a non-empty string")
        need = pages_needed(self.gen, request, self.pool.page_bytes, self.pool.num_pages)
        now = self.clock() if arrival is None else arrival
        sched = scheduled(request, self.model, now, priority, slo_ms, self.cost,
                          self.slo_scale)
        check_standalone(sched, max_standalone_s, "this device")
        ticket = Ticket(request.request_id, priority, window_ms(sched))
        job = Job(gen=request, sched=sched, ticket=ticket, timing=Timing(arrival=now),
                  pages_needed=need)
        if self._exact is not None:
            self._exact.register(job.id, self.pool.page_bytes, need)
        if not self.intake.push(job, self.max_queued):
            if self._exact is not None:
                self._exact.forget(job.id)
            backlog = self.backlog_s()
            raise QueueFull(f"{self.max_queued} requests are already waiting "
                            f"(~{backlog:.0f} s of work); retry later",
                            retry_after_s=max(1.0, backlog))
        return ticket

    def backlog_s(self) -> float:
        """Seconds of work queued and running, by the cost model (each request alone:
        batching only makes it shorter)."""
        with self.intake.lock:
            jobs = list(self.intake.live.values())
        total = 0.0
        for job in jobs:
            status = job.status
            if status is None:
                total += job.sched.standalone_s or 0.0
            else:
                total += self.cost.remaining_time(job.sched, status.steps_done,
                                                  status.blocks_done)
        return total

    def cancel(self, request_id: str, reason: str = "cancelled by the client") -> bool:
        """Cancel a queued or running request: its future raises ``RequestCancelled`` and
        its pages are freed at the top of the next iteration. False if unknown/finished."""
        return self.intake.cancel(request_id, reason)

    def progress(self, request_id: str) -> float | None:
        """Fraction of denoising steps done (0..1, blocks of a part-done step counted),
        None when unknown or finished. Updated by the engine thread as each step or chunk
        of blocks ends."""
        with self.intake.lock:
            job = self.intake.live.get(request_id)
        if job is None:
            return None
        status = job.status
        if status is None:
            return 0.0
        blocks = getattr(self.gen, "num_blocks", 0) or 0
        part = status.blocks_done / blocks if blocks else 0.0
        return min(1.0, (status.steps_done + part) / max(1, job.sched.steps))

    def status(self, request_id: str) -> str | None:
        """"queued" (waiting to start), "in_progress" (started: encoded, stepping, paused
        or decoding) or None when unknown or finished."""
        with self.intake.lock:
            job = self.intake.live.get(request_id)
        if job is None:
            return None
        return "queued" if job.phase is Phase.WAITING else "in_progress"

    def stats(self):
        """An ``EngineStats`` snapshot."""
        return self.intake.snapshot()

    def add_listener(self, listener) -> None:
        """``listener.on_step(seconds, batch_size)`` and ``listener.on_finish(result)`` are
        called from the engine thread (keep them cheap)."""
        self._listeners.append(listener)

    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ditmem-engine", daemon=True)
            self._thread.start()
        return self

    def drain(self, timeout: float | None = None) -> bool:
        """Stop intake, finish what was submitted, stop the thread. True when all finished;
        False when ``timeout`` passed first (the rest is then cancelled) or the engine died."""
        with self.intake.lock:
            self.intake.draining = True
            self.intake.wake.notify()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._thread is not None and self._thread.is_alive():
            with self.intake.lock:
                if not self.intake.live:
                    break
            if deadline is not None and time.monotonic() > deadline:
                self.stop()
                return False
            time.sleep(0.01)
        self.stop()
        return self.intake.dead is None

    def stop(self) -> None:
        """Stop now: whatever is unfinished is cancelled (pages freed)."""
        with self.intake.lock:
            self.intake.stopping = True
            for job_id in list(self.intake.live):
                self.intake.cancels.append((job_id, "the engine stopped"))
            self.intake.wake.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        ex = self.executor
        failures = 0
        try:
            while True:
                try:
                    self.handoff.serve()
                    worked = ex.iterate()
                    failures = 0
                except Exception as exc:  # noqa: BLE001 - the loop survives one iteration
                    failures += 1
                    self._fail_iteration(exc, failures)
                    worked = True
                if self.intake.stopping and not ex.has_work():
                    ex.take_intake()
                    if not ex.has_work():
                        break
                if not worked:
                    self.intake.wait(self.idle_wait_s if ex.has_work() else None)
        except BaseException as exc:  # noqa: BLE001 - dead: say why, fail everyone
            self._die(exc)
        try:
            ex.close()
        except Exception:  # noqa: BLE001
            log.exception("engine: closing the executor failed")

    def _fail_iteration(self, exc: Exception, failures: int) -> None:
        """Log a failed iteration and fail the requests it held; raise when the engine
        cannot go on (too many failures in a row)."""
        held = sorted(self.executor.held)
        log.error("engine iteration failed (%d in a row), requests held: %s",
                  failures, ", ".join(held) or "none", exc_info=exc)
        reason = f"engine iteration failed: {exc!r}"
        failed = self.executor.fail_held(lambda rid: EngineFault(f"{rid}: {reason}"))
        for rid in failed:
            log.warning("request %s failed: %s", rid, reason)
        self.executor.publish()
        if failures >= self.max_failures:
            raise RuntimeError(f"{failures} iterations in a row failed; last: {exc!r}")

    def _die(self, exc: BaseException) -> None:
        """Mark the engine dead and fail every live request (pages released where the
        executor still can)."""
        reason = repr(exc)
        log.critical("engine dead: %s", reason, exc_info=exc)
        with self.intake.lock:
            self.intake.dead = reason
            self.intake.stopping = True
            self.intake.new.clear()
            live = list(self.intake.live.values())
        ex = self.executor
        for job in live:
            error = EngineFault(f"{job.id}: the engine died ({reason})")
            try:
                if job.id not in ex.jobs and job.id not in ex.active:
                    ex.jobs[job.id] = job  # submitted but never taken in
                ex.finish(job, error=error)
            except Exception:  # noqa: BLE001 - the client still gets its answer
                log.exception("engine: releasing %s failed", job.id)
                self.intake.forget(job, started=job.phase is Phase.ACTIVE)
                if not job.ticket.future.done():
                    job.ticket.future.set_exception(error)
        try:
            ex.publish()
        except Exception:  # noqa: BLE001
            log.exception("engine: publishing stats failed")

    def _notify_step(self, seconds: float, batch: int) -> None:
        for listener in self._listeners:
            listener.on_step(seconds, batch)

    def _notify_finish(self, result) -> None:
        for listener in self._listeners:
            listener.on_finish(result)


__all__ = ["Engine", "RequestCancelled"]
