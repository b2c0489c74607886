"""Serving live traffic on a node: the engine interface the HTTP app uses, over the node
loop (``run_node``) and the device workers.

:class:`NodeService` is what ``ditmem serve --devices N`` hands to ``create_app`` in place
of the single-device ``Engine``: ``submit`` / ``cancel`` / ``stats`` / ``drain`` / ``stop``
/ ``add_listener`` / ``progress`` / ``status`` / ``backlog_s`` with the same meanings, so
the routes are the same code. One thread runs ``run_node`` with a
:class:`~ditmem.parallel.intake.LiveIntake` over :class:`~ditmem.parallel.devices.
EngineDevices`; a request's result is its decoded image (from the decode lane) with its
timing (from the loop's record). What a serving user sees:

* bad input: the same checks and errors as one device (``SubmitError`` subclasses: 400,
  413, 429, 503), raised by ``submit`` before anything reaches the loop;
* cancel (client gone): the loop drops the request between decisions and its pages are
  freed on every device it held (a request mid-job is dropped when its job ends);
* a dead worker: the requests with state on its device fail with the reason
  (``EngineFault``: 503), the loop never gives that device work again, the others keep
  serving; when every device is gone the service is dead;
* drain: intake stops, admitted requests finish (or are cancelled at the timeout), the
  loop ends and the workers stop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ditmem.engine.admission import check_standalone, pages_needed, scheduled, window_ms
from ditmem.engine.results import (
    EngineFault,
    EngineStopped,
    GenerationResult,
    InvalidRequest,
    QueueFull,
    RequestCancelled,
    RequestFailed,
    Ticket,
)
from ditmem.engine.stats import EngineStats
from ditmem.engine.timing import Timing
from ditmem.models.common.request import GenerationRequest
from ditmem.parallel.devices import EngineDevices
from ditmem.parallel.intake import IntakeClosed, LiveIntake
from ditmem.parallel.node import DeviceLost
from ditmem.scheduler import Request

log = logging.getLogger(__name__)


@dataclass(slots=True)
class DeviceState:
    """One device as /health and /metrics show it: device pool pages in use (from the
    worker's latest reply), and why it is gone (None while alive)."""

    device: int
    pages_used: int
    pages_total: int
    lost: str | None = None


@dataclass(slots=True)
class NodeStats(EngineStats):
    """``EngineStats`` of the whole node plus ``devices`` (one :class:`DeviceState` each)."""

    devices: list[DeviceState] = field(default_factory=list)


@dataclass(slots=True)
class _Live:
    """A submitted request: what the model runs, the scheduler's record of it, its ticket
    and what is known so far."""

    gen: GenerationRequest
    sched: Request
    ticket: Ticket
    timing: Timing
    started: bool = False
    steps_done: int = 0
    image: object = None


class NodeService:
    """The node behind the HTTP app (see module docstring).

    node: a started ``NodeEngine`` (owned: stopped with the service); generator: the model
    in this process, for the request checks only (rules, tokenizer, page estimate;
    ``serve --devices`` passes one without weights, ``front_model.load_for_checks``); cost:
    a ``CostModel`` whose profile has the node's ``parallel`` and ``links`` sections (owned:
    its device and host pool sizes are set to the node's, so the loop counts the pages the
    workers have);
    policy: a node policy name ("slo" elastic degree and migration, "fifo" on static
    single-device replicas); model: the scheduler's model key.
    """

    def __init__(self, node, generator, cost, *, policy: str = "slo",
                 model: str = "qwen-image", max_active: int = 64, max_queued: int = 256,
                 slo_scale: float = 3.0, decode_tile: tuple[int, int] | None = None,
                 policy_options: dict | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from ditmem.scheduler.node.cost import NodeCost
        from ditmem.scheduler.node.policies import make_node_policy
        from ditmem.scheduler.node.topology import Node

        self.node, self.gen, self.cost, self.model = node, generator, cost, model
        _fit_pools(cost, node, model)
        self.max_active, self.max_queued, self.slo_scale = max_active, max_queued, slo_scale
        self.truth = NodeCost(cost)
        self.topology = Node(node.num_devices, self.truth.links)
        self.policy = make_node_policy(policy, NodeCost(cost), self.topology,
                                       **(policy_options or {}))
        self.devices = EngineDevices(node, self._to_generation, decode_tile=decode_tile,
                                     clock=clock, on_output=self._on_output,
                                     on_failed=self._on_failed, on_event=self._on_event)
        self.intake = LiveIntake(model, self.devices.now, self.devices.notify,
                                 self._on_dropped)
        node.on_lost = self._on_lost
        self._lock = threading.Lock()
        self._live: dict[str, _Live] = {}
        #: what the model runs per request id, until the loop is done with it (a request
        #: cancelled mid-job is still encoded or stepped by that job)
        self._gens: dict[str, GenerationRequest] = {}
        self._listeners: list = []
        self.stats_counts = NodeStats()
        self._draining = False
        self._dead: str | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ other threads
    def submit(self, request: GenerationRequest, *, priority: int = 1,
               slo_ms: float | None = None, arrival: float | None = None,
               max_standalone_s: float | None = None) -> Ticket:
        """As ``Engine.submit``: the request's ticket at once, or a ``SubmitError``."""
        if self._dead is not None:
            raise EngineStopped(f"the node is dead ({self._dead}); restart the server")
        if self._draining:
            raise EngineStopped("the server is shutting down and takes no new requests")
        if not request.request_id:
            raise ValueError("request_id: must be a non-empty string")
        pages_needed(self.gen, request, self.node.page_bytes, self.node.pool_pages,
                     "a device pool")
        now = self.devices.now() if arrival is None else arrival
        sched = scheduled(request, self.model, now, priority, slo_ms, self.cost,
                          self.slo_scale)
        check_standalone(sched, max_standalone_s, "one device")
        ticket = Ticket(request.request_id, priority, window_ms(sched))
        live = _Live(request, sched, ticket, Timing(arrival=now))
        with self._lock:
            if request.request_id in self._live:
                raise InvalidRequest(f"request_id: {request.request_id!r} is in flight",
                                     "request_id")
            waiting = sum(not x.started for x in self._live.values())
            if waiting >= self.max_queued:
                self.stats_counts.rejected += 1
                backlog = self.backlog_s()
                raise QueueFull(f"{self.max_queued} requests are already waiting "
                                f"(~{backlog:.0f} s of work); retry later",
                                retry_after_s=max(1.0, backlog))
            self._live[request.request_id] = live
            self._gens[request.request_id] = request
        try:
            self.intake.push(sched)
        except IntakeClosed:
            with self._lock:
                self._live.pop(request.request_id, None)
                self._gens.pop(request.request_id, None)
            raise EngineStopped("the server is shutting down and takes no new requests") \
                from None
        return ticket

    def cancel(self, request_id: str, reason: str = "cancelled by the client") -> bool:
        """Cancel a queued or running request: its future raises ``RequestCancelled`` now;
        the loop drops it and frees its pages on every device. False if unknown/finished."""
        live = self._finish(request_id, RequestCancelled(f"{request_id}: {reason}"),
                            "cancelled")
        if live is None:
            return False
        if self.intake.cancel(request_id):  # never reached the loop
            with self._lock:
                self._gens.pop(request_id, None)
        return True

    def backlog_s(self) -> float:
        """Seconds of work queued and running (each request alone at degree 1)."""
        with self._lock:
            items = list(self._live.values())
        return sum(self.cost.remaining_time(x.sched, x.steps_done, 0) for x in items)

    def progress(self, request_id: str) -> float | None:
        with self._lock:
            live = self._live.get(request_id)
        if live is None:
            return None
        return min(1.0, live.steps_done / max(1, live.sched.steps))

    def status(self, request_id: str) -> str | None:
        with self._lock:
            live = self._live.get(request_id)
        if live is None:
            return None
        return "in_progress" if live.started else "queued"

    def stats(self) -> NodeStats:
        """A snapshot: the node's counters and each device's pages (no worker round trip)."""
        with self._lock:
            items = list(self._live.values())
            s = self.stats_counts.copy()
        s.draining, s.dead = self._draining, self._dead
        s.queued = sum(not x.started for x in items)
        s.running = len(items) - s.queued
        pool = self.node.pool_pages
        s.devices = [DeviceState(d, self.node.device_pages.get(d, 0), pool,
                                 self.node.dead.get(d))
                     for d in range(self.node.num_devices)]
        s.pages_used = sum(d.pages_used for d in s.devices if d.lost is None)
        s.pages_free = sum(pool - d.pages_used for d in s.devices if d.lost is None)
        return s

    def add_listener(self, listener) -> None:
        """``listener.on_step(seconds, batch_size)`` (per packed step, from a job's
        completion) and ``listener.on_finish(result)``."""
        self._listeners.append(listener)

    def start(self) -> NodeService:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ditmem-node-loop",
                                            daemon=True)
            self._thread.start()
        return self

    def drain(self, timeout: float | None = None) -> bool:
        """Stop intake, let admitted requests finish, stop the loop and the workers. True
        when all finished; False when ``timeout`` passed first (the rest is cancelled) or
        the node died."""
        self._draining = True
        self.intake.close()
        finished = self._join(timeout)
        if not finished:
            with self._lock:
                ids = list(self._live)
            for rid in ids:
                self.cancel(rid, "the server stopped before it finished (drain timed out)")
            self._join(30.0)
        self._close_node()
        return finished and self._dead is None

    def stop(self) -> None:
        """Stop now: whatever is unfinished is cancelled (pages freed), workers stopped."""
        self.drain(0.0)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the loop to end (after ``drain`` / the intake closed)."""
        return self._join(timeout)

    # ------------------------------------------------------------------ internals
    def _join(self, timeout: float | None) -> bool:
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _close_node(self) -> None:
        try:
            self.node.close()
        except Exception:  # noqa: BLE001 - stopping: nothing more to do for it
            log.exception("node: closing the workers failed")

    def _to_generation(self, sched: Request) -> GenerationRequest:
        with self._lock:
            return self._gens[sched.id]

    def _run(self) -> None:
        from ditmem.scheduler.node.simulator import run_node

        try:
            run_node(self.intake, self.policy, _Listened(self), self.topology, self.truth,
                     slo_scale=self.slo_scale, page_bytes=self.node.page_bytes,
                     max_started_per_device=max(1, self.max_active // self.node.num_devices),
                     on_record=self._on_record)
        except BaseException as exc:  # noqa: BLE001 - dead: say why, fail everyone
            self._die(f"the node loop stopped: {exc!r}")
            log.critical("node loop dead", exc_info=exc)

    def _die(self, reason: str) -> None:
        self._dead = self._dead or reason
        with self._lock:
            ids = list(self._live)
        for rid in ids:
            self._finish(rid, EngineFault(f"{rid}: {reason}"), "failed")

    def _finish(self, rid: str, error: BaseException | None, outcome: str,
                result: GenerationResult | None = None) -> _Live | None:
        """Resolve ``rid``'s ticket once (later calls: None)."""
        with self._lock:
            live = self._live.pop(rid, None)
            if live is None:
                return None
            c = self.stats_counts
            if outcome == "completed":
                c.completed += 1
                met = result.slo_met
                (c.slo_met if met else c.slo_missed)[result.priority] += 1
            elif outcome == "cancelled":
                c.cancelled += 1
            else:
                c.failed += 1
        if error is not None:
            live.ticket.future.set_exception(error)
        else:
            live.ticket.future.set_result(result)
            for listener in self._listeners:
                listener.on_finish(result)
        return live

    # callbacks: job threads (devices), the loop thread (record, dropped), a reader (lost)
    def _on_event(self, kind: str, rids: list[str], seconds: float) -> None:
        with self._lock:
            for rid in rids:
                live = self._live.get(rid)
                if live is None:
                    continue
                t = live.timing
                if kind == "moved":
                    t.offload_s += seconds
                    continue
                t.running_s += seconds
                if kind == "encoded":
                    live.started = True
                    t.encode_s += seconds
                elif kind == "decoded":
                    t.decode_s += seconds
                else:
                    live.steps_done += 1
            if kind == "stepped":
                self.stats_counts.steps += 1

    def _on_output(self, rid: str, image) -> None:
        with self._lock:
            live = self._live.get(rid)
            if live is not None:
                live.image = image

    def _on_failed(self, rid: str, exc: BaseException) -> None:
        with self._lock:
            live = self._live.get(rid)
            done = live is None or live.image is not None
        if done:  # finished (its image came) or already answered
            return
        error = (EngineFault(f"{rid}: {exc}") if isinstance(exc, DeviceLost)
                 else RequestFailed(f"{rid}: {type(exc).__name__}: {exc}"))
        self._finish(rid, error, "failed")
        self._let_go(rid)

    def _let_go(self, rid: str) -> None:
        """Ask the loop to drop ``rid`` (answered already: failed or lost)."""
        if self.intake.cancel(rid):
            with self._lock:
                self._gens.pop(rid, None)

    def _on_record(self, record) -> None:
        rid = record.request.id
        with self._lock:
            live = self._live.get(rid)
            self._gens.pop(rid, None)
        if live is None or live.image is None:
            if live is not None:  # finished without an image: its decode failed
                self._finish(rid, RequestFailed(f"{rid}: no image was decoded"), "failed")
            return
        t = live.timing
        t.finished, t.started = record.finished, record.started
        t.steps_run = live.sched.steps
        t.preemptions, t.offloads = record.preemptions, record.offloads
        peak = self.node.peak_pages(rid, forget=True) * self.node.page_bytes
        result = GenerationResult(rid, live.sched.priority, live.ticket.slo_ms, t, live.image,
                                  peak)
        self._finish(rid, None, "completed", result)

    def _on_dropped(self, rid: str, started: bool) -> None:
        with self._lock:
            self._gens.pop(rid, None)
        self.node.peak_pages(rid, forget=True)
        if started:
            try:
                self.node.release(rid)
            except Exception as exc:  # noqa: BLE001 - a lost device holds nothing any more
                log.debug("release of cancelled %s: %s", rid, exc)

    def _on_lost(self, device: int, reason: str, failed: list[str]) -> None:
        self.intake.mark_lost(device)
        for rid in failed:
            self._finish(rid, EngineFault(f"{rid}: {reason}"), "failed")
            self._let_go(rid)
        if len(self.node.dead) >= self.node.num_devices:
            self._die(f"every device is lost (last: {reason})")


def _fit_pools(cost, node, model: str) -> None:
    """Make ``cost``'s device pages per device and host pages equal the node's pools (the
    profile's sizes are the machine's it was measured on)."""
    page = node.page_bytes
    have = cost.device_pages(model, page)
    cost.profile["device_bytes"] += (node.pool_pages - have) * page
    cost.profile["host_bytes"] = node.host_pages * node.num_devices * page
    if cost.device_pages(model, page) != node.pool_pages:
        raise ValueError(f"cost: could not fit the profile to the node's pool of "
                         f"{node.pool_pages} pages")


class _Listened:
    """The service's devices for the loop: ``EngineDevices`` plus step listeners fed from
    each job's steps (seconds per packed step, batch size), once per job: at its first
    event once its steps are over (``stepped``, or its ``last`` event; a job hands its
    devices and decodes back in several events, all carrying the job's ``Timings``)."""

    def __init__(self, service: NodeService) -> None:
        self.service = service
        self.inner = service.devices
        self.link_busy_s = 0.0
        self._stepped: set[int] = set()  # jobs whose steps were reported, until their end

    def launch(self, job, now: float) -> None:
        self.inner.launch(job, now)

    def reclaim(self, job, device: int, now: float) -> None:
        """``NodeDevices.reclaim`` (a split decode's spare taken back: ``slo``'s default)."""
        self.inner.reclaim(job, device, now)

    def wait(self, until):
        done = self.inner.wait(until)
        for c in done:
            if not (c.stepped or c.last):
                continue
            jid = c.job.job_id
            first = jid not in self._stepped
            if c.last:
                self._stepped.discard(jid)
            elif first:
                self._stepped.add(jid)
            if first and c.job.steps and c.job.batch:
                per_step = c.timings.step_s / c.job.steps
                for listener in self.service._listeners:
                    for _ in range(c.job.steps):
                        listener.on_step(per_step, len(c.job.batch))
        return done
