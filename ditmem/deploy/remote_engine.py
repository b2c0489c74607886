"""The engine interface of ``ditmem.server`` over the Ray Serve engine deployment.

:class:`RemoteEngine` is what the ingress hands to :func:`ditmem.server.app.create_app`
instead of a local :class:`ditmem.engine.Engine`: the same ``submit`` / ``cancel`` /
``progress`` / ``status`` / ``stats`` / ``backlog_s`` / ``drain`` calls, so the HTTP routes
are the server's own. ``submit`` prices the request with the replicas' cost model (its
``route``: work, pages, priority, deadline), sends it through the deployment handle (the
router picks the replica) and blocks until that replica took it or refused it, so a refusal
raises the engine's own ``SubmitError`` (400/413/429/503) exactly as a local engine does.

Faults: when the replica running a request dies, the request is sent again, from its
first step, to another replica (``reroutes`` times at most; then it fails with
``EngineFault``, 503). Its pages died with the replica, and the request is deterministic
(same seed, same steps), so the image is the one the first replica would have made; the
deadline stays the original one, so the router sees how late it is.

Migration: a replica's rebalancer may hand a parked request off (:mod:`.replica`); its
stream then ends with ``{"moved": [ObjectRef], "route": ...}`` and the flight goes on: the
blob is sent through the handle's ``adopt`` (the router ranks it by its remaining work,
the replica it came from excluded), the ticket's future stays the same and the client gets
one response, whichever replica finishes it. An adopter that refuses the blob, or cannot
read it (its owner died), makes the flight start over from step 0 as a re-route does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields
from typing import Any

from ditmem.deploy.errors import rebuild_error
from ditmem.engine.admission import scheduled, window_ms
from ditmem.engine.results import EngineFault, EngineStopped, RequestCancelled, Ticket
from ditmem.engine.stats import EngineStats
from ditmem.scheduler import CostModel
from ditmem.scheduler.routing import RouteRequest

log = logging.getLogger(__name__)


def _replica_died(exc: BaseException) -> bool:
    from ray.exceptions import ActorUnavailableError, RayActorError

    return isinstance(exc, (RayActorError, ActorUnavailableError))


def _settle(future: concurrent.futures.Future, result=None, exc=None) -> bool:
    """Set a future once; False when it was already set (a cancel raced the result)."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
        return True
    except concurrent.futures.InvalidStateError:
        return False


@dataclass(slots=True)
class Flight:
    """A request on its way: the job sent, its ticket, the replica that holds it."""

    job: dict
    ticket: Ticket
    response: Any = None
    replica: str | None = None
    cancelled: bool = False
    sent: int = 0
    deaths: int = 0
    move: dict | None = None   # the adopt job while the request is handed off
    moves: int = 0


def sum_stats(stats: list[EngineStats]) -> EngineStats:
    """Counters and gauges added up field by field (lists element-wise)."""
    total = EngineStats()
    for s in stats:
        for f in fields(EngineStats):
            mine, theirs = getattr(total, f.name), getattr(s, f.name)
            if isinstance(mine, bool) or mine is None or isinstance(mine, str):
                continue
            if isinstance(mine, list):
                setattr(total, f.name, [a + b for a, b in zip(mine, theirs, strict=True)])
            elif isinstance(mine, (int, float)):
                setattr(total, f.name, mine + theirs)
    return total


class RemoteEngine:
    """``handle``: the engine deployment's handle; ``info``: a replica's ``describe()``
    (model key, page size, slo scale, parsed cost profile); ``loop``: the ingress's event loop
    (handle calls run there); ``stale_s``: a replica whose last board report is older is
    down."""

    gen = None  # no model here: prompts are tokenized on the replicas

    def __init__(self, handle, info: dict, *, loop: asyncio.AbstractEventLoop,
                 accept_timeout_s: float = 60.0, reroutes: int = 1, stale_s: float = 5.0):
        self.handle = handle.options(stream=True)
        self.model = info["model"]
        self.page_bytes = int(info["page_bytes"])
        self.slo_scale = float(info["slo_scale"])
        self.cost = CostModel(info["profile"])
        self.loop = loop
        self.accept_timeout_s = accept_timeout_s
        self.reroutes = reroutes
        self.stale_s = stale_s
        self.lock = threading.Lock()
        self.flights: dict[str, Flight] = {}
        self.reports: dict[str, dict] = {}
        self.routed: Counter[str] = Counter()
        self.rerouted = 0
        self.moved = 0
        self.move_failed = 0
        self.draining = False
        self.listeners: list = []

    # ------------------------------------------------------------------ engine interface
    def submit(self, request, *, priority: int = 1, slo_ms: float | None = None,
               arrival: float | None = None, max_standalone_s: float | None = None) -> Ticket:
        """Send ``request`` to a replica and return its ticket once the replica took it.
        Blocks (a handle round trip, and the router's wait when every replica is full):
        never call it on the event loop. Raises what the replica's engine raised."""
        if self.draining:
            raise EngineStopped("the server is shutting down and takes no new requests")
        if not request.request_id:
            raise ValueError("request_id: must be a non-empty string")
        if self._on_loop():
            raise RuntimeError("RemoteEngine.submit blocks: call it off the event loop")
        now = time.time() if arrival is None else arrival
        sched = scheduled(request, self.model, now, priority, slo_ms, self.cost,
                          self.slo_scale)
        route = RouteRequest(request.request_id, float(sched.standalone_s),
                             int(self.cost.pages_for(sched, self.page_bytes)), priority,
                             float(sched.deadline))
        job = {"request": request, "priority": priority, "slo_ms": slo_ms,
               "max_standalone_s": max_standalone_s, "route": asdict(route)}
        ticket = Ticket(request.request_id, priority, window_ms(sched))
        flight = Flight(job, ticket)
        with self.lock:
            if request.request_id in self.flights:
                raise ValueError(f"request_id: {request.request_id!r} is already running")
            self.flights[request.request_id] = flight
        ticket.future.add_done_callback(lambda _: self._forget(request.request_id))
        accepted: concurrent.futures.Future = concurrent.futures.Future()
        asyncio.run_coroutine_threadsafe(self._fly(flight, accepted), self.loop)
        try:
            first = accepted.result(timeout=self.accept_timeout_s)
        except concurrent.futures.TimeoutError:
            self.cancel(request.request_id, "no replica took it in time")
            raise EngineStopped(f"no engine replica took the request within "
                                f"{self.accept_timeout_s:g} s (are any up?)") from None
        if isinstance(first, Exception):
            self._forget(request.request_id)
            raise first
        ticket.slo_ms = float(first.get("slo_ms", ticket.slo_ms))
        return ticket

    def cancel(self, request_id: str, reason: str = "cancelled by the client") -> bool:
        with self.lock:
            flight = self.flights.get(request_id)
        if flight is None:
            return False
        flight.cancelled = True
        if flight.response is not None:
            self.loop.call_soon_threadsafe(flight.response.cancel)
        _settle(flight.ticket.future, exc=RequestCancelled(reason))
        return True

    def progress(self, request_id: str) -> float | None:
        """Fraction of steps done as the replica last posted it (0.0 before it started;
        None when unknown or finished)."""
        flight = self.flights.get(request_id)
        if flight is None:
            return None
        report = self.reports.get(flight.replica or "", {})
        return float(report.get("progress", {}).get(request_id, 0.0))

    def status(self, request_id: str) -> str | None:
        flight = self.flights.get(request_id)
        if flight is None:
            return None
        report = self.reports.get(flight.replica or "", {})
        return "in_progress" if request_id in report.get("progress", {}) else "queued"

    def stats(self) -> EngineStats:
        """The replicas that are up, added up; ``dead`` when none is up."""
        up = self.replicas_up()
        total = sum_stats([EngineStats(**r["stats"]) for r in up])
        total.draining = self.draining
        if not up and self.reports:
            total.dead = "no engine replica is up"
        return total

    def backlog_s(self) -> float:
        return sum(sum(r["load"]["backlog_s"]) for r in self.replicas_up())

    def add_listener(self, listener) -> None:
        """``on_finish(result)`` runs as results come back; steps run on the replicas
        (their step counts are in ``/metrics`` per replica)."""
        self.listeners.append(listener)

    def start(self) -> RemoteEngine:
        return self

    def drain(self, timeout: float | None = None) -> bool:
        self.draining = True
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.flights:
            if deadline is not None and time.monotonic() > deadline:
                self.stop()
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        self.draining = True
        for request_id in list(self.flights):
            self.cancel(request_id, "the server stopped")

    # ------------------------------------------------------------------ replicas
    def replicas_up(self) -> list[dict]:
        now = time.time()
        return [r for r in self.reports.values() if now - r["at"] <= self.stale_s]

    # ------------------------------------------------------------------ internals
    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def _forget(self, request_id: str) -> None:
        with self.lock:
            self.flights.pop(request_id, None)

    async def _fly(self, flight: Flight, accepted: concurrent.futures.Future) -> None:
        """Send the job, report acceptance, deliver the outcome; follow the request when a
        replica hands it off; re-route when the replica holding it dies."""
        ticket = flight.ticket
        while not flight.cancelled:
            flight.sent += 1
            if flight.move is not None:
                flight.response = self.handle.adopt.remote(flight.move)
            else:
                flight.response = self.handle.generate.remote(flight.job)
            dead = flight.replica
            try:
                first = await flight.response.__anext__()
                if "rejected" in first:
                    err = rebuild_error(first["rejected"])
                    if flight.move is not None:
                        self.move_failed += 1
                        log.warning("replica %s refused handed-off %s (%s): starting it "
                                    "over", first.get("replica"), ticket.request_id, err)
                        flight.move = None
                        continue
                    if not _settle(accepted, err):
                        _settle(ticket.future, exc=EngineFault(
                            f"replica {dead} died and the re-routed request was refused: "
                            f"{err}"))
                    return
                flight.replica = first["accepted"]
                self.routed[flight.replica] += 1
                _settle(accepted, first)
                outcome = await flight.response.__anext__()
            except asyncio.CancelledError:
                raise
            except StopAsyncIteration:
                outcome = {"error": {"kind": "EngineFault",
                                     "message": "the replica ended the stream early"}}
            except Exception as exc:
                if flight.cancelled:
                    return
                flight.deaths += 1
                if _replica_died(exc) and flight.deaths <= self.reroutes:
                    self.rerouted += 1
                    flight.move = None  # its pages died with it (or with the blob's owner)
                    log.warning("replica %s died holding %s: re-routing it (%s)",
                                flight.replica, ticket.request_id, type(exc).__name__)
                    continue
                fault = EngineFault(f"engine replica {flight.replica or '?'} failed: "
                                    f"{type(exc).__name__}: {exc}")
                if not _settle(accepted, EngineStopped(str(fault))):
                    _settle(ticket.future, exc=fault)
                return
            if "moved" in outcome:
                flight.moves += 1
                self.moved += 1
                flight.move = {"blob": outcome["moved"], "route": outcome["route"],
                               "avoid": outcome.get("replica"),
                               "hops": outcome.get("hops", flight.moves),
                               "request_id": ticket.request_id}
                continue
            if "result" in outcome:
                if _settle(ticket.future, outcome["result"]):
                    for listener in self.listeners:
                        listener.on_finish(outcome["result"])
            else:
                _settle(ticket.future, exc=rebuild_error(outcome["error"]))
            return
