"""One engine replica of the Ray Serve deployment.

:class:`EngineReplica` builds an engine (``ditmem.engine.factory.build_engine``) in its Ray
actor and serves ``generate`` as a stream of two messages: first whether the engine took
the request (``{"accepted": replica}`` or ``{"rejected": {...}}``, so the caller can answer
400/413/429 as a local server does), then its outcome (``{"result": GenerationResult}`` or
``{"error": {...}}``). Ray Serve calls ``record_routing_stats`` (what the router ranks by)
and ``check_health`` (a dead engine fails it; Serve then replaces the replica). The replica
posts its state to the board every ``post_period_s`` for ``/health`` and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import asdict

from ditmem.deploy.errors import describe_error
from ditmem.deploy.load import live_progress, replica_load
from ditmem.engine.results import SubmitError

log = logging.getLogger(__name__)


class EngineReplica:
    """``config``: the replica's ``EngineConfig``; ``board``: the board deployment's handle
    (None: no posting); ``threads``: torch threads of the engine (the CPUs the replica
    reserved)."""

    async def __init__(self, config, board=None, threads: int | None = None,
                       post_period_s: float = 0.5):
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
        self._poster = asyncio.get_running_loop().create_task(self._post_forever()) \
            if board is not None else None

    # ------------------------------------------------------------------ requests
    async def generate(self, job: dict):
        """Stream ``{"accepted"|"rejected"}`` then ``{"result"|"error"}`` for ``job``
        (``request``: a ``GenerationRequest``; ``priority``; ``slo_ms``;
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
        try:
            result = await asyncio.wrap_future(ticket.future)
        except asyncio.CancelledError:
            self.engine.cancel(request.request_id, "the client went away")
            raise
        except Exception as exc:  # the request's outcome, not this replica's fault
            yield {"error": describe_error(exc), "replica": self.name}
            return
        yield {"result": result, "replica": self.name}

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
                "progress": live_progress(self.engine)}

    async def _post_forever(self) -> None:
        while True:
            try:
                await self.board.post.remote(self.report())
            except Exception as exc:  # the board restarting: try again next period
                log.warning("replica %s: posting to the board failed: %s", self.name, exc)
            await asyncio.sleep(self.post_period_s)

    def __del__(self):
        poster = getattr(self, "_poster", None)
        if poster is not None:
            poster.cancel()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()
