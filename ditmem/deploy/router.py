"""The ditmem request router on the engine deployment (Ray Serve ``RequestRouter``).

Ray Serve runs one router per deployment handle, in the caller's process (here: each
ingress replica). For a ``generate`` call it reads the request's ``route`` (work, pages,
priority, deadline: :class:`~ditmem.scheduler.routing.RouteRequest`) and every candidate
replica's last ``record_routing_stats`` report, ranks them with
:func:`ditmem.scheduler.routing.rank_replicas` (the rule the simulator runs) and hands Ray
one replica per rank, best first; Ray sends the request to the first that accepts it (its
queue is under ``max_ongoing_requests``). What it routed since a replica's last report is
kept in a :class:`~ditmem.scheduler.routing.RoutingBook` (``on_request_routed``).
Other calls (``describe``) carry no route and go to any replica. An ``adopt`` call (a
request a replica handed off) is ranked the same way without the replica it came from
(``avoid``), unless no other is up.
"""

from __future__ import annotations

import logging
import time

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from ditmem.scheduler.routing import ReplicaLoad, RouteRequest, RoutingBook, rank_replicas

log = logging.getLogger(__name__)

#: Seconds a routed request may take to reach its replica's engine (Ray's queues, a busy
#: replica's event loop): a report that soon after the send must list it to cover it.
TRANSIT_S = 10.0


def route_of(pending: PendingRequest | None) -> RouteRequest | None:
    """The ``route`` the ingress put in a ``generate`` or ``adopt`` job, None for other
    calls."""
    if pending is None or not pending.args or not isinstance(pending.args[0], dict):
        return None
    route = pending.args[0].get("route")
    return RouteRequest(**route) if route else None


def avoid_of(pending: PendingRequest | None) -> str | None:
    """The replica an ``adopt`` job comes from (it handed the request off)."""
    if pending is None or not pending.args or not isinstance(pending.args[0], dict):
        return None
    return pending.args[0].get("avoid")


def load_of_replica(replica: RunningReplica) -> ReplicaLoad:
    """A replica's last report, keyed by its Ray replica id; a replica that has not
    reported yet counts as idle (and everything routed to it since it started counts)."""
    name = replica.replica_id.unique_id
    stats = replica.routing_stats
    if stats:
        try:
            load = ReplicaLoad.from_dict(stats)
            load.replica = name
            return load
        except ValueError as exc:
            log.warning("replica %s: unreadable routing stats (%s): taken as idle", name, exc)
    return ReplicaLoad(name, (0.0, 0.0, 0.0), (None, None, None), 2**31, 2**31, 0,
                       float("-inf"))


def without_source(candidates: list, avoid: str | None) -> list:
    """``candidates`` less the replica ``avoid`` names, unless it is the only one (a
    handed-off request then goes back where it came from rather than nowhere)."""
    others = [r for r in candidates if r.replica_id.unique_id != avoid]
    return others or list(candidates)


def rank_candidates(route: RouteRequest, candidates: list, book: RoutingBook,
                    now: float) -> list[list]:
    """``choose_replicas``'s answer for a routed call: one replica per rank, best first
    (``candidates`` need only ``replica_id.unique_id`` and ``routing_stats``)."""
    by_name = {r.replica_id.unique_id: r for r in candidates}
    loads = [load_of_replica(r) for r in candidates]
    return [[by_name[s.replica]] for s in rank_replicas(route, loads, book, now)]


class DitmemRequestRouter(RequestRouter):
    """Ranks the replicas by :func:`ditmem.scheduler.routing.rank_replicas`."""

    def initialize_state(self, **kwargs) -> None:
        self.book = RoutingBook(transit_s=kwargs.get("transit_s", TRANSIT_S))
        self.clock = kwargs.get("clock", time.time)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        route = route_of(pending_request)
        candidates = without_source(candidate_replicas, avoid_of(pending_request))
        if route is None or len(candidates) < 2:
            return [candidates]
        return rank_candidates(route, candidates, self.book, self.clock())

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        route = route_of(pending_request)
        if route is not None:
            self.book.record(replica_id.unique_id, route, self.clock())

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self.book.forget(replica_id.unique_id)
