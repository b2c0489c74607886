"""Where the engine replicas post their state and the ingress reads it (a one-replica
Serve deployment, so Serve owns its life and restarts it).

A Ray Serve handle call reaches one replica chosen by the router, never a named one, so the
ingress cannot ask each replica for ``/health`` and ``/metrics``; instead every replica
posts a report every ``post_period_s`` and the ingress polls the board.
"""

from __future__ import annotations

import time


class Board:
    """Latest report per replica; reports older than ``forget_s`` are dropped (a replica
    Serve replaced has a new id and its old one stops posting)."""

    def __init__(self, forget_s: float = 120.0):
        self.forget_s = forget_s
        self.reports: dict[str, dict] = {}

    def post(self, report: dict) -> None:
        self.reports[report["replica"]] = report

    def snapshot(self) -> dict[str, dict]:
        now = time.time()
        self.reports = {k: r for k, r in self.reports.items() if now - r["at"] <= self.forget_s}
        return dict(self.reports)
