"""R replicas behind a router, simulated: the routing rules of :mod:`.routing` over any
per-replica simulator (a node of D devices, :mod:`.node.simulator`, or one device).

The router acts at each arrival, as Ray Serve's does: it sees each replica's last report
(taken every ``report_s`` seconds, Ray's ``request_routing_stats_period_s``) and what it
has routed since (:class:`~.routing.RoutingBook`). A report at time t is read off the
replica's own simulation of the requests routed to it so far (all arrived by t; the
simulators are causal, so later arrivals cannot change what happened before t): a request
is live at t when it arrived and had not finished; its remaining work is its standalone
time when it had not started, else that less the time since it started (the replica
itself reports the cost model's estimate from its steps done; the simulation does not
expose steps at t, and nothing later than t is used). A D-device replica reports work in
replica-seconds (device-seconds / D) with ``speed`` 1/D and ``devices`` D.

Once every request is placed, each replica's requests are simulated once more, to the end:
those records are the result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .request import Request
from .routing import ReplicaLoad, RouteRequest, RoutingBook, load_of

#: ``run_replica(requests, index)`` -> records with ``request``, ``started``, ``finished``.
ReplicaSim = Callable[[list[Request], int], list]


@dataclass(slots=True)
class ClusterResult:
    """Every request's record (pooled over replicas), which replica each request went to,
    and how many report refreshes the run took."""

    records: list
    placement: dict[str, int]
    refreshes: int


def report_at(records: Sequence, replica: str, t: float, devices: int,
              pages: int = 2**31) -> ReplicaLoad:
    """What replica ``replica`` would report at ``t`` given its simulated ``records``
    (module docstring)."""
    items = []
    for rec in records:
        r = rec.request
        if r.arrival > t or rec.finished <= t:
            continue
        alone = r.standalone_s or 0.0
        remaining = alone if rec.started > t else max(0.0, alone - (t - rec.started))
        items.append((r.priority, r.deadline, remaining / devices))
    return load_of(replica, items, pages, pages, t, 1.0 / devices, devices)


def simulate_cluster(requests: Sequence[Request], replicas: int, router,
                     run_replica: ReplicaSim, *, devices: int = 1, report_s: float = 10.0,
                     pages_for: Callable[[Request], int] | None = None) -> ClusterResult:
    """Route ``requests`` (deadlines and standalone times set) over ``replicas`` replicas
    with ``router`` (``choose(route, loads, book, now)``: :func:`.routing.make_router`) and
    simulate each replica with ``run_replica``. ``devices``: devices per replica (the unit
    of its reports); ``report_s``: seconds between reports."""
    if replicas < 1:
        raise ValueError(f"replicas: must be >= 1, got {replicas}")
    if not report_s > 0:
        raise ValueError(f"report_s: must be > 0, got {report_s}")
    pending = sorted(requests, key=lambda r: (r.arrival, r.id))
    for r in pending:
        if r.deadline is None or r.standalone_s is None:
            raise ValueError(f"request {r.id!r}: assign a deadline first (cost.assign_deadline)")
    names = [f"replica-{i}" for i in range(replicas)]
    assigned: list[list[Request]] = [[] for _ in range(replicas)]
    simulated: list[tuple[int, list]] = [(0, []) for _ in range(replicas)]
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
                if simulated[i][0] != len(assigned[i]):
                    simulated[i] = (len(assigned[i]), run_replica(list(assigned[i]), i))
                    refreshes += 1
                loads[i] = report_at(simulated[i][1], names[i], epoch, devices)
        pages = pages_for(req) if pages_for is not None else 0
        route = RouteRequest(req.id, req.standalone_s, pages, req.priority, req.deadline)
        name = router.choose(route, loads, book, req.arrival)
        index = names.index(name)
        assigned[index].append(req)
        placement[req.id] = index
    records = []
    for i in range(replicas):
        records += run_replica(list(assigned[i]), i) if assigned[i] else []
    return ClusterResult(records, placement, refreshes)
