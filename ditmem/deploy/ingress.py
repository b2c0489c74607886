"""The HTTP ingress: ``ditmem.server``'s FastAPI app over the engine deployment.

The app is :func:`ditmem.server.app.create_app` itself (no second copy of the routes) over
a :class:`~ditmem.deploy.remote_engine.RemoteEngine`. On top of it: ``/metrics`` gains the
per-replica families (``ditmem_replica_*{replica=...}``) beside the server's own, which
add the replicas up; ``GET /health/replicas`` lists each replica's state. ``/health`` is
the server's: 200 while any replica is up, 503 (``dead``) when none is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from ray import serve

from ditmem.deploy.remote_engine import RemoteEngine

log = logging.getLogger(__name__)


class ReplicaCollector:
    """Prometheus families with a ``replica`` label, from the board's last reports."""

    def __init__(self, remote: RemoteEngine):
        self.remote = remote

    def describe(self):
        return []

    def collect(self):
        now = time.time()
        reports = dict(self.remote.reports)
        up = GaugeMetricFamily("ditmem_replica_up", "1 while the replica posts its state",
                               labels=["replica"])
        gauges = {key: GaugeMetricFamily(f"ditmem_replica_{name}", doc, labels=["replica"])
                  for name, key, doc in (
                      ("queue_depth", "queued", "requests waiting to start"),
                      ("running", "running", "requests holding device pages"),
                      ("paused", "paused", "preempted requests"),
                      ("pages_free", "pages_free", "device pool pages free"),
                      ("pages_used", "pages_used", "device pool pages in use"))}
        counters = {name: CounterMetricFamily(f"ditmem_replica_{name}", doc,
                                              labels=["replica"])
                    for name, doc in (("completed", "requests completed"),
                                      ("failed", "requests failed"),
                                      ("steps", "denoising step batches run"))}
        backlog = GaugeMetricFamily("ditmem_replica_backlog_seconds",
                                    "seconds of work left by priority (cost model)",
                                    labels=["replica", "priority"])
        slack = GaugeMetricFamily("ditmem_replica_earliest_slack_seconds",
                                  "least slack among the replica's requests",
                                  labels=["replica"])
        routed = CounterMetricFamily("ditmem_replica_routed",
                                     "requests this ingress sent to the replica",
                                     labels=["replica"])
        for name, report in sorted(reports.items()):
            up.add_metric([name], 1.0 if now - report["at"] <= self.remote.stale_s else 0.0)
            stats, load = report["stats"], report["load"]
            for key, family in gauges.items():
                family.add_metric([name], stats[key])
            for key, family in counters.items():
                family.add_metric([name], stats[key])
            for p, seconds in enumerate(load["backlog_s"]):
                backlog.add_metric([name, str(p)], seconds)
            values = [s for s in load["slack_s"] if s is not None]
            if values:
                slack.add_metric([name], min(values))
        for name, count in sorted(self.remote.routed.items()):
            routed.add_metric([name], count)
        rerouted = CounterMetricFamily("ditmem_rerouted",
                                       "requests sent again after their replica died")
        rerouted.add_metric([], self.remote.rerouted)
        moved = CounterMetricFamily("ditmem_moved",
                                    "parked requests handed from one replica to another")
        moved.add_metric([], self.remote.moved)
        move_failed = CounterMetricFamily(
            "ditmem_move_failed", "handed-off requests no replica adopted (started over)")
        move_failed.add_metric([], self.remote.move_failed)
        yield up
        yield from gauges.values()
        yield from counters.values()
        yield backlog
        yield slack
        yield routed
        yield rerouted
        yield moved
        yield move_failed


def build_ingress_app(remote: RemoteEngine, config):
    """``create_app(remote, config)`` plus the per-replica metrics and ``/health/replicas``."""
    from ditmem.server.app import create_app

    app = create_app(remote, config, drain_on_shutdown=False)
    app.state.metrics.registry.register(ReplicaCollector(remote))

    @app.get("/health/replicas")
    async def replicas():
        now = time.time()
        rows = []
        for name, r in sorted(remote.reports.items()):
            s = r["stats"]
            rows.append({"replica": name, "up": now - r["at"] <= remote.stale_s,
                         "seen_s_ago": round(now - r["at"], 3), "host": r["host"],
                         "pid": r["pid"], "queued": s["queued"], "running": s["running"],
                         "paused": s["paused"], "dead": s.get("dead"),
                         "backlog_s": r["load"]["backlog_s"],
                         "pages_free": s["pages_free"], "routed": remote.routed[name],
                         "speed": r["load"].get("speed", 1.0),
                         "moved_out": r.get("moves", {}).get("out", 0),
                         "moved_in": r.get("moves", {}).get("in", 0)})
        return {"replicas": rows, "up": sum(row["up"] for row in rows)}

    return app


@serve.ingress()
class Ingress:
    """``engine``/``board``: handles of the engine and board deployments; ``config``: the
    ``ServerConfig`` (its ``rules`` default to the replicas' model's)."""

    async def __init__(self, engine, board, config, poll_s: float = 0.5,
                       accept_timeout_s: float = 60.0, reroutes: int = 1):
        info = await engine.describe.remote()
        self.remote = RemoteEngine(engine, info, loop=asyncio.get_running_loop(),
                                   accept_timeout_s=accept_timeout_s, reroutes=reroutes,
                                   stale_s=max(5.0, 6 * poll_s))
        self.config = config if config.rules is not None else replace(config,
                                                                      rules=info["rules"])
        self.board = board
        self.poll_s = poll_s
        self.remote.reports = await board.snapshot.remote()
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                self.remote.reports = await self.board.snapshot.remote()
            except Exception as exc:  # the board restarting: keep the last snapshot
                log.warning("ingress: reading the board failed: %s", exc)

    def __serve_build_asgi_app__(self):
        return build_ingress_app(self.remote, self.config)
