"""How much work future arrivals will slot in before a given deadline (an online estimate).

A request arriving later with SLO window W and standalone time S lands before a deadline
Δ seconds away (and is served first in deadline order) when it arrives within the next
Δ − W seconds. Over the recently seen arrivals (rate taken over their time span) the
expected such work is ``Σ S · max(0, Δ − W) / span``, evaluated with prefix sums over
arrivals sorted by W (O(log n) per query). Kept per priority class, so a request can be
charged only for the future arrivals that would outrank it (same or higher priority).
"""

from __future__ import annotations

import bisect
from collections import deque

from ..request import PRIORITY_WEIGHTS, Request


class _ClassSums:
    def __init__(self, rows: list[tuple[float, float]]):
        rows.sort()
        self.windows = [w for w, _ in rows]
        self.cum_s, self.cum_sw = [0.0], [0.0]
        for w, s in rows:
            self.cum_s.append(self.cum_s[-1] + s)
            self.cum_sw.append(self.cum_sw[-1] + s * w)

    def work(self, delta: float) -> float:
        k = bisect.bisect_left(self.windows, delta)
        return delta * self.cum_s[k] - self.cum_sw[k]


class ArrivalForecast:
    """Keeps the last ``memory`` arrivals the policy has seen; answers ``work_before``."""

    def __init__(self, memory: int = 200):
        self._recent: deque[tuple[float, float, float, int]] = deque(maxlen=memory)
        self._latest = float("-inf")
        self._sums: dict[int, _ClassSums] | None = None
        self._span = 0.0
        self._min_slack: float | None = None
        self._top: int | None = None

    @property
    def latest(self) -> float:
        """Arrival time of the newest request seen (-inf before any)."""
        return self._latest

    def see(self, requests: list[Request]) -> None:
        """Record arrivals (each once; pass them oldest first)."""
        for r in requests:
            if r.arrival > self._latest:
                self._recent.append((r.arrival, r.standalone_s, r.deadline - r.arrival, r.priority))
                self._latest = r.arrival
                self._sums = None
                self._min_slack = None
                self._top = None

    def _rebuild(self, now: float) -> dict[int, _ClassSums]:
        by_class: dict[int, list[tuple[float, float]]] = {p: [] for p in PRIORITY_WEIGHTS}
        for _, s, w, p in self._recent:
            by_class[p].append((w, s))
        self._sums = {p: _ClassSums(rows) for p, rows in by_class.items()}
        # A rate needs time to show: never extrapolate from a span shorter than the longest
        # SLO window seen (a burst at start-up would otherwise read as an infinite rate).
        longest = max(w for _, _, w, _ in self._recent)
        self._span = max(now - self._recent[0][0], longest)
        return self._sums

    def top_priority(self) -> int | None:
        """The highest priority (lowest number) among the recent arrivals (None before
        any)."""
        if not self._recent:
            return None
        if self._top is None:
            self._top = min(p for *_, p in self._recent)
        return self._top

    def min_slack(self) -> float | None:
        """Least ``SLO window − standalone time`` among the recent arrivals (seconds; None
        before any): how long a new arrival can afford to wait behind running work."""
        if not self._recent:
            return None
        if self._min_slack is None:
            self._min_slack = min(w - s for _, s, w, _ in self._recent)
        return self._min_slack

    def work_before(self, delta: float, now: float, priority: int = 2) -> float:
        """Expected seconds of work from future arrivals of priority ≤ ``priority`` that
        will be due within ``delta`` seconds."""
        if len(self._recent) < 2 or delta <= 0:
            return 0.0
        sums = self._sums if self._sums is not None else self._rebuild(now)
        total = sum(sums[p].work(delta) for p in sums if p <= priority)
        return total / self._span
