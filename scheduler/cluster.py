"""R replicas behind a router, simulated: the routing rules of :mod:`.routing` over any
per-replica simulator (a node of D devices, :mod:`.node.simulator`, or one device).

The router acts at each arrival, as Ray Serve's does: it sees each replica's last report
(taken every ``report_s`` seconds, Ray's ``request_routing_stats_period_s``) and what it
has routed since (:class:`~.routing.RoutingBook`). A report at time t is read off the
replica's own simulation of the requests routed to it so far (all arrived by t; the
simulators are causal, so later arrivals cannot change what happened before t): a request
is live at t when it arrived and had not finished; its remaining work is its standalone
time times the share of its steps not done at t, as the replica itself reports (the cost
model's estimate from its steps done). Steps done come from the simulation's job
completions up to t (:class:`ReplicaRun` ``progress``; a job still running at t counts
none of its steps); nothing later than t is used. A D-device replica reports work in
replica-seconds (device-seconds / D) with ``speed`` 1/D and ``devices`` D.

Reading steps, not the time since a request started, matters on a node: a request paused
behind earlier-deadline work does no work while the clock runs, and one running at degree
k does k devices' work; "standalone less the time since it started" got both wrong
(docs/results/deploy.md, "Session 5").

Once every request is placed, each replica runs to the end: those records are the result.
A node replica runs once, fed live (:class:`.cluster_replica.SteppedNode`: the cost grows
with the requests, not their square); any other replica simulation can be re-run from
t = 0 at each report (:class:`.cluster_replica.Resimulated`), which gives the same
reports because the simulators are causal.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .request import Request
from .routing import ReplicaLoad, RouteRequest, RoutingBook, load_of


@dataclass(slots=True)
class ReplicaRun:
    """One replica's simulation: ``records`` (each with ``request``, ``started``,
    ``finished``) and ``progress``: per request id, ``(t, steps done by t)`` at the end of
    each of its jobs, in time order (cumulative steps)."""

    records: list
    progress: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def steps_done(self, request_id: str, t: float) -> int:
        """Steps of ``request_id`` completed by jobs that ended at or before ``t``."""
        marks = self.progress.get(request_id, ())
        i = bisect.bisect_right(marks, (t, math.inf))
        return marks[i - 1][1] if i else 0


#: ``run_replica(requests, index)`` -> the replica's :class:`ReplicaRun`.
ReplicaSim = Callable[[list[Request], int], ReplicaRun]


class SimReplica(Protocol):
    """One replica's simulation as the cluster drives it: ``add`` a routed request (in
    arrival order, none before the last ``advance``), ``advance(t)`` to a report epoch (its
    state then), ``finish()`` every record once all are routed."""

    def add(self, request: Request) -> None: ...

    def advance(self, t: float) -> ReplicaRun: ...

    def finish(self) -> list: ...


@dataclass(slots=True)
class ClusterResult:
    """Every request's record (pooled over replicas), which replica each request went to,
    and how many replica reports the run read (replicas x report epochs)."""

    records: list
    placement: dict[str, int]
    refreshes: int


def report_at(run: ReplicaRun, replica: str, t: float, devices: int,
              pages: int = 2**31) -> ReplicaLoad:
    """What replica ``replica`` would report at ``t`` given its simulation ``run``
    (module docstring)."""
    items = []
    for rec in run.records:
        r = rec.request
        if r.arrival > t or rec.finished <= t:
            continue
        alone = r.standalone_s or 0.0
        left = max(0, r.steps - run.steps_done(r.id, t)) / r.steps if r.steps else 1.0
        items.append((r.priority, r.deadline, alone * left / devices))
    return load_of(replica, items, pages, pages, t, 1.0 / devices, devices)


def simulate_cluster(requests: Sequence[Request], replicas: int, router,
                     make_replica: Callable[[int], SimReplica], *, devices: int = 1,
                     report_s: float = 10.0,
                     pages_for: Callable[[Request], int] | None = None) -> ClusterResult:
    """Route ``requests`` (deadlines and standalone times set) over ``replicas`` replicas
    with ``router`` (``choose(route, loads, book, now)``: :func:`.routing.make_router`);
    ``make_replica(index)`` gives each replica's simulation (:class:`SimReplica`:
    :class:`.cluster_replica.SteppedNode` for a node run once, fed live, or
    :class:`.cluster_replica.Resimulated` for any ``run_replica(requests, index)`` run
    anew at each report). ``devices``: devices per replica (the unit of its reports);
    ``report_s``: seconds between reports."""
    if replicas < 1:
        raise ValueError(f"replicas: must be >= 1, got {replicas}")
    if not report_s > 0:
        raise ValueError(f"report_s: must be > 0, got {report_s}")
    pending = sorted(requests, key=lambda r: (r.arrival, r.id))
    for r in pending:
        if r.deadline is None or r.standalone_s is None:
            raise ValueError(f"request {r.id!r}: assign a deadline first (cost.assign_deadline)")
    names = [f"replica-{i}" for i in range(replicas)]
    sims = [make_replica(i) for i in range(replicas)]
    loads = [ReplicaLoad(n, (0.0, 0.0, 0.0), (None, None, None), 2**31, 2**31, 0,
                         -math.inf, 1.0 / devices, devices) for n in names]
    book = RoutingBook()
    placement: dict[str, int] = {}
    epoch, refreshes = -math.inf, 0
    for req in pending:
        latest = math.floor(req.arrival / report_s) * report_s
        if latest > epoch and getattr(router, "uses_reports", True):
            epoch = latest
            for i in range(replicas):
                loads[i] = report_at(sims[i].advance(epoch), names[i], epoch, devices)
                refreshes += 1
        pages = pages_for(req) if pages_for is not None else 0
        route = RouteRequest(req.id, req.standalone_s, pages, req.priority, req.deadline)
        name = router.choose(route, loads, book, req.arrival)
        index = names.index(name)
        sims[index].add(req)
        placement[req.id] = index
    records = []
    for sim in sims:
        records += sim.finish()
    records.sort(key=lambda rec: (rec.request.arrival, rec.request.id))
    return ClusterResult(records, placement, refreshes)
