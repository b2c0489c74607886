"""Where the engine replicas post their state and the ingress reads it (a one-replica
Serve deployment, so Serve owns its life and restarts it).

A Ray Serve handle call reaches one replica chosen by the router, never a named one, so the
ingress cannot ask each replica for ``/health`` and ``/metrics``; instead every replica
posts a report every ``post_period_s`` and the ingress polls the board. For the same reason
an operator's order to move a request off its replica (``order_move``: before taking a
node down, or to test migration) waits here until the replica holding it asks
(``take_orders``, every rebalancer period).
"""

from __future__ import annotations

import time


class Board:
    """Latest report per replica; reports older than ``forget_s`` are dropped (a replica
    Serve replaced has a new id and its old one stops posting)."""

    def __init__(self, forget_s: float = 120.0):
        self.forget_s = forget_s
        self.reports: dict[str, dict] = {}
        self.orders: dict[str, float] = {}  # request id -> when ordered

    def post(self, report: dict) -> None:
        self.reports[report["replica"]] = report

    def snapshot(self) -> dict[str, dict]:
        now = time.time()
        self.reports = {k: r for k, r in self.reports.items() if now - r["at"] <= self.forget_s}
        return dict(self.reports)

    def order_move(self, request_id: str) -> None:
        """Ask the replica holding ``request_id`` to hand it to another (once it is parked:
        started, between steps); forgotten after ``forget_s`` if no replica holds it."""
        self.orders[request_id] = time.time()

    def take_orders(self, replica: str, live: list[str]) -> list[str]:
        """The ordered moves among ``live`` (the ids ``replica`` holds), now taken."""
        now = time.time()
        self.orders = {k: t for k, t in self.orders.items() if now - t <= self.forget_s}
        mine = [rid for rid in live if rid in self.orders]
        for rid in mine:
            del self.orders[rid]
        return mine
