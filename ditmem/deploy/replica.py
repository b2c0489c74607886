"""One engine replica of the Ray Serve deployment.

:class:`EngineReplica` builds an engine (``ditmem.engine.factory.build_engine``) in its Ray
actor and serves ``generate`` as a stream of two messages: first whether the engine took
the request (``{"accepted": replica}`` or ``{"rejected": {...}}``, so the caller can answer
400/413/429 as a local server does), then its outcome (``{"result": GenerationResult}`` or
``{"error": {...}}``). Ray Serve calls ``record_routing_stats`` (what the router ranks by)
and ``check_health`` (a dead engine fails it; Serve then replaces the replica). The replica
posts its state to the board every ``post_period_s`` for ``/health`` and ``/metrics``.

Migration (the rebalancer, one per replica, every ``MoveOptions.period_s``): a parked
request of this replica that misses its deadline here while another replica's last report
places it on time there (:func:`ditmem.scheduler.routing.plan_moves`), or one an operator
ordered off through the board (``Board.order_move``), is exported from the engine
(:mod:`ditmem.engine.handoff`), put in Ray's object store as one blob (``ray.put``) and its
``generate`` (or ``adopt``) stream ends with ``{"moved": [ref], "route": ...}``: the ingress
sends the blob on through the router (``adopt``), which places it as any request, this
replica excluded. ``adopt`` streams as ``generate`` does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass

from ditmem.deploy.errors import describe_error
from ditmem.deploy.load import live_progress, replica_load
from ditmem.engine.handoff import BadBlob, HandoffRefused, RequestMoved
from ditmem.engine.results import RequestFailed, SubmitError
from ditmem.scheduler.routing import ReplicaLoad, RouteRequest, RoutingBook, plan_moves

log = logging.getLogger(__name__)


@dataclass(slots=True)
class MoveOptions:
    """The rebalancer: ``period_s`` between two looks (0: off, no orders either);
    ``rule``: apply :func:`~ditmem.scheduler.routing.plan_moves` (False: only moves an
    operator ordered); ``move_s``: what a hand-off costs, taken off the request's deadline
    when judging another replica (export, object store, routing, adopt, restore: tens of
    ms here, plus the age of the reports); ``max_moves``: moves of one request at most;
    ``hold_s``: an adopted request stays at least this long; ``stale_s``: reports older
    than this are ignored."""

    period_s: float = 1.0
    rule: bool = True
    move_s: float = 0.5
    max_moves: int = 2
    hold_s: float = 3.0
    stale_s: float = 3.0


@dataclass(slots=True)
class Move:
    """An exported request on its way out: the blob's object ref, its route (remaining
    work, pages, priority, deadline), the steps it had done and its moves so far."""

    ref: object
    route: dict
    steps_done: int
    hops: int


class EngineReplica:
    """``config``: the replica's ``EngineConfig``; ``board``: the board deployment's handle
    (None: no posting, no rebalancer); ``threads``: torch threads of the engine (the CPUs
    the replica reserved); ``moves``: :class:`MoveOptions`."""

    async def __init__(self, config, board=None, threads: int | None = None,
                       post_period_s: float = 0.5, moves: MoveOptions | None = None):
        from ray import serve

        from ditmem.engine.factory import build_engine
        from ditmem.engine.threads import set_torch_threads

        self.name = serve.get_replica_context().replica_id.unique_id
        set_torch_threads(threads)
        self.config = config
        self.engine = await asyncio.to_thread(lambda: build_engine(config).start())
        self.board = board
        self.post_period_s = post_period_s
        self.started_at = time.time()
        import ray

        self.put = ray.put  # the blob's way into the object store
        self.move_options = moves or MoveOptions(period_s=0.0)
        self.streams: set[str] = set()          # requests whose stream waits here
        self.outgoing: dict[str, asyncio.Future] = {}
        self.hops: dict[str, int] = {}
        self.adopted_at: dict[str, float] = {}
        self.move_book = RoutingBook(transit_s=10.0)
        self.move_log: deque = deque(maxlen=32)
        self.moved = {"out": 0, "in": 0}
        loop = asyncio.get_running_loop()
        self._poster = loop.create_task(self._post_forever()) if board is not None else None
        self._mover = (loop.create_task(self._rebalance_forever())
                       if board is not None and self.move_options.period_s > 0 else None)

    # ------------------------------------------------------------------ requests
    async def generate(self, job: dict):
        """Stream ``{"accepted"|"rejected"}`` then ``{"result"|"error"|"moved"}`` for
        ``job`` (``request``: a ``GenerationRequest``; ``priority``; ``slo_ms``;
        ``max_standalone_s``; ``route``: what the router read)."""
        request = job["request"]
        try:
            ticket = await asyncio.to_thread(
                self.engine.submit, request, priority=job.get("priority", 1),
                slo_ms=job.get("slo_ms"), max_standalone_s=job.get("max_standalone_s"))
        except SubmitError as exc:
            yield {"rejected": describe_error(exc), "replica": self.name}
            return
        yield {"accepted": self.name, "slo_ms": ticket.slo_ms}
        async for message in self._follow(request.request_id, ticket):
            yield message

    async def adopt(self, job: dict):
        """Stream as :meth:`generate` for a request another replica handed off: ``blob``
        (``[ObjectRef]`` of a ``ParkedBlob``), ``route``, ``avoid`` (its last replica),
        ``hops`` (moves so far)."""
        try:
            blob = await job["blob"][0]
            ticket = await asyncio.to_thread(self.engine.handoff.adopt, blob)
        except (BadBlob, HandoffRefused) as exc:
            yield {"rejected": describe_error(exc), "replica": self.name}
            return
        except Exception as exc:  # the blob is gone (its owner died): the ingress restarts it
            log.warning("replica %s: the blob of %s is unreadable: %r", self.name,
                        job.get("request_id"), exc)
            yield {"rejected": describe_error(exc), "replica": self.name}
            return
        rid = blob.request_id
        self.hops[rid] = int(job.get("hops", 1))
        self.adopted_at[rid] = time.monotonic()
        self.moved["in"] += 1
        self.move_log.append({"id": rid, "dir": "in", "steps_done": blob.steps_done,
                              "digest": blob.digest, "from": blob.source, "at": time.time()})
        yield {"accepted": self.name, "slo_ms": ticket.slo_ms, "adopted": blob.steps_done}
        async for message in self._follow(rid, ticket):
            yield message

    async def _follow(self, rid: str, ticket):
        """The outcome of a request this replica's engine holds."""
        self.streams.add(rid)
        try:
            while True:
                try:
                    result = await asyncio.wrap_future(ticket.future)
                    break
                except RequestMoved:
                    pending = self.outgoing.pop(rid, None)
                    outcome = await pending if pending is not None else None
                    if isinstance(outcome, Move):
                        yield {"moved": [outcome.ref], "route": outcome.route,
                               "replica": self.name, "steps_done": outcome.steps_done,
                               "hops": outcome.hops}
                        return
                    if outcome is None:  # exported by someone other than the rebalancer
                        raise RequestFailed(f"{rid}: left this engine, its blob is not here") \
                            from None
                    ticket = outcome  # the blob could not leave: adopted back here
        except asyncio.CancelledError:
            self.engine.cancel(rid, "the client went away")
            raise
        except Exception as exc:  # the request's outcome, not this replica's fault
            yield {"error": describe_error(exc), "replica": self.name}
            return
        finally:
            self.streams.discard(rid)
            self.hops.pop(rid, None)
            self.adopted_at.pop(rid, None)
        yield {"result": result, "replica": self.name}

    # ------------------------------------------------------------------ migration
    async def _rebalance_forever(self) -> None:
        while True:
            await asyncio.sleep(self.move_options.period_s)
            try:
                await self._rebalance()
            except Exception as exc:  # the board restarting, a replica going: next period
                log.warning("replica %s: rebalancing failed: %r", self.name, exc)

    async def _rebalance(self) -> None:
        """One look: ordered moves first, then the rule's (at most one per look)."""
        opts = self.move_options
        ordered = await self.board.take_orders.remote(self.name, sorted(self.streams))
        for rid in ordered:
            await self._move_out(rid, "ordered")
        if not opts.rule:
            return
        reports = await self.board.snapshot.remote()
        now = time.time()
        others = []
        for name, report in reports.items():
            if name != self.name and now - report["at"] <= opts.stale_s:
                try:
                    others.append(ReplicaLoad.from_dict(report["load"]))
                except ValueError as exc:
                    log.warning("replica %s: report of %s unreadable: %s", self.name, name,
                                exc)
        if not others:
            return
        here = replica_load(self.engine, self.name, now)
        routes = self._parked_routes(now)
        moves = plan_moves(here, list(routes.values()), others, self.move_book, now,
                           move_s=opts.move_s, limit=1)
        for rid, target in moves:
            log.info("replica %s: %s misses its deadline here, on time on %s: moving it",
                     self.name, rid, target)
            await self._move_out(rid, f"late here, on time on {target}")

    def _parked_routes(self, wall: float) -> dict[str, RouteRequest]:
        """Started requests between steps whose stream waits here and that may move."""
        opts, engine = self.move_options, self.engine
        offset = wall - engine.clock()
        speed = engine.cost.correction(engine.model) or 1.0
        with engine.intake.lock:
            jobs = list(engine.intake.live.values())
        out = {}
        for job in jobs:
            status = job.status
            if (status is None or status.blocks_done or job.id not in self.streams
                    or job.id in self.outgoing or self.hops.get(job.id, 0) >= opts.max_moves
                    or time.monotonic() - self.adopted_at.get(job.id, -1e18) < opts.hold_s):
                continue
            remaining = engine.cost.remaining_time(job.sched, status.steps_done, 0)
            out[job.id] = RouteRequest(job.id, remaining / speed, job.pages_needed,
                                       job.sched.priority, job.sched.deadline + offset)
        return out

    async def _move_out(self, rid: str, why: str) -> bool:
        """Export ``rid``, put its blob in the object store, hand it to its stream."""
        if rid not in self.streams or rid in self.outgoing:
            return False
        future = asyncio.get_running_loop().create_future()
        self.outgoing[rid] = future
        try:
            blob = await asyncio.to_thread(self.engine.handoff.export, rid, source=self.name)
        except HandoffRefused as exc:
            log.info("replica %s: %s stays (%s)", self.name, rid, exc)
            self.outgoing.pop(rid, None)
            return False
        wall = time.time()
        speed = self.engine.cost.correction(self.engine.model) or 1.0
        route = RouteRequest(rid, self._remaining(blob) / speed, blob.pages_needed,
                             blob.priority, wall + blob.deadline_in_s)
        try:
            ref = self.put(blob)
        except Exception as exc:  # the object store refused it: the request stays here
            log.warning("replica %s: %s could not leave (%r): adopting it back", self.name,
                        rid, exc)
            try:
                future.set_result(await asyncio.to_thread(self.engine.handoff.adopt, blob))
            except Exception as back:  # noqa: BLE001 - its stream reports the failure
                future.set_exception(RequestFailed(f"{rid}: hand-off failed ({exc!r}) and "
                                                   f"adopting it back failed ({back!r})"))
            return False
        self.moved["out"] += 1
        self.move_log.append({"id": rid, "dir": "out", "steps_done": blob.steps_done,
                              "digest": blob.digest, "why": why, "at": wall})
        future.set_result(Move(ref, asdict(route), blob.steps_done,
                               self.hops.get(rid, 0) + 1))
        return True

    def _remaining(self, blob) -> float:
        from ditmem.scheduler import Request

        g = blob.request
        req = Request(id=blob.request_id, arrival=0.0, model=self.engine.model,
                      width=g.width, height=g.height, frames=g.num_frames,
                      steps=g.num_inference_steps, priority=blob.priority)
        return self.engine.cost.remaining_time(req, blob.steps_done, 0)

    # ------------------------------------------------------------------ Ray Serve hooks
    def record_routing_stats(self) -> dict:
        """What :class:`ditmem.deploy.router.DitmemRequestRouter` ranks this replica by."""
        return replica_load(self.engine, self.name).as_dict()

    def check_health(self) -> None:
        dead = getattr(self.engine.stats(), "dead", None)
        if dead is not None:
            raise RuntimeError(f"engine dead: {dead}")

    def describe(self) -> dict:
        """What the ingress needs to price requests as this replica does."""
        from ditmem.server.limits import ModelRules

        return {"model": self.engine.model, "page_bytes": self.engine.pool.page_bytes,
                "slo_scale": self.engine.slo_scale, "profile": self.engine.cost.profile,
                "rules": ModelRules.of(self.engine.gen), "replica": self.name}

    def report(self) -> dict:
        """This replica's state for the board: engine stats, load, pid, host."""
        return {"replica": self.name, "pid": os.getpid(), "host": os.uname().nodename,
                "at": time.time(), "started_at": self.started_at,
                "stats": asdict(self.engine.stats()),
                "load": replica_load(self.engine, self.name).as_dict(),
                "progress": live_progress(self.engine),
                "moves": {**self.moved, "log": list(self.move_log)}}

    async def _post_forever(self) -> None:
        while True:
            try:
                await self.board.post.remote(self.report())
            except Exception as exc:  # the board restarting: try again next period
                log.warning("replica %s: posting to the board failed: %s", self.name, exc)
            await asyncio.sleep(self.post_period_s)

    def __del__(self):
        # Ray Serve calls this at shutdown, but the garbage collector may too: on any thread,
        # at any allocation, possibly while that thread holds the engine's intake lock
        # (Engine.stop takes it, then joins the engine thread). So never block here: stop
        # the engine from a thread of its own.
        for task in (getattr(self, "_poster", None), getattr(self, "_mover", None)):
            if task is not None:
                task.cancel()
        engine = getattr(self, "engine", None)
        if engine is not None:
            threading.Thread(target=engine.stop, name=f"stop-{getattr(self, 'name', '?')}",
                             daemon=True).start()
