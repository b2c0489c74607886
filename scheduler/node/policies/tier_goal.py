"""Per-tier latency goals measured at run time (node ``slo``'s ``tier_goal`` option).

A tier is one request shape (model, width, height, frames, steps). A latency percentile p
of a mix (the P95: p = 95) lies in one tier: order the tiers by their standalone time,
largest first, and it is the one where the share of requests seen so far at least that
large first reaches 1 − p/100. Within that tier it sits at the tier's own quantile
q = 1 − (1 − p/100 − share of the larger tiers) / the tier's share (seed-mix's P95: the
2048² tier's median; omni-mix's: the 1536² tier's 67th percentile). The goal of that tier
is the q-quantile of its own latencies measured so far (the last ``window`` finished);
other tiers have none. So nothing is set to a bar: the goal follows what the node achieves,
and with step 4 serving the requests that can still reach it first, it settles where the
share q of the tier can be made.

Serving a goal runs its tier wider than degree 1, which costs device-seconds (a 1536² at
degree 2 takes 1.2 × its degree-1 work on h200). So with ``devices`` > 0 a goal is given
only while the measured load leaves room for that in the fluid limit: the arrival rate of
each tier seen so far (requests ÷ the span of arrivals) × its work at degree 1, the goal's
tier at its least parallel degree instead (``wide_s``: device-seconds there), summed,
at most ``devices``. On 8 × h200 that closes the goal above ρ ≈ 0.91 on omni-mix
(near its goodput, where it cost attainment) and leaves it open at ρ 0.7–0.8.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from ...request import Request

Tier = tuple


def tier_of(req: Request) -> Tier:
    """The tier key of ``req``: (model, width, height, frames, steps)."""
    return (req.model, req.width, req.height, req.frames, req.steps)


@dataclass(slots=True)
class TierGoals:
    """Arrivals and latencies per tier, and the goal of the tier holding the percentile.

    ``percentile`` in (0, 100); ``window``: latencies kept per tier (the most recent);
    ``min_samples``: finished requests of a tier before it has a goal; ``devices``: the
    node's devices for the load gate (0: no gate). Times in seconds."""

    percentile: float = 95.0
    window: int = 100
    min_samples: int = 5
    devices: int = 0
    #: tier → [requests seen, standalone time at degree 1 (s), device-s at the least
    #: parallel degree]
    _seen: dict = field(default_factory=dict)
    #: tier → (deque of latencies in finish order, the same sorted)
    _lat: dict = field(default_factory=dict)
    #: request id → (tier, arrival)
    _open: dict = field(default_factory=dict)
    _total: int = 0
    #: the latest and the first arrival seen (s)
    latest: float = float("-inf")
    first: float = float("inf")

    def __post_init__(self) -> None:
        if not 0.0 < self.percentile < 100.0:
            raise ValueError(f"percentile must be in (0, 100), got {self.percentile}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples}")

    def see(self, req: Request, standalone_s: float, wide_s: float | None = None) -> None:
        """Count ``req`` (once per id) in its tier; ``standalone_s``: its time alone at
        degree 1; ``wide_s``: its device-seconds alone at the node's least parallel degree
        (degree × time; default ``standalone_s``: the gate then sees no extra cost)."""
        if req.id in self._open:
            return
        t = tier_of(req)
        entry = self._seen.get(t)
        if entry is None:
            self._seen[t] = [1, standalone_s, standalone_s if wide_s is None else wide_s]
        else:
            entry[0] += 1
        self._total += 1
        self._open[req.id] = (t, req.arrival)
        self.latest = max(self.latest, req.arrival)
        self.first = min(self.first, req.arrival)

    def finished(self, request_id: str, now: float) -> None:
        """Record the latency of ``request_id`` finished at ``now`` (ignored if unseen)."""
        entry = self._open.pop(request_id, None)
        if entry is None:
            return
        t, arrival = entry
        lat = now - arrival
        ring, ordered = self._lat.setdefault(t, (deque(), []))
        ring.append(lat)
        bisect.insort(ordered, lat)
        if len(ring) > self.window:
            old = ring.popleft()
            del ordered[bisect.bisect_left(ordered, old)]

    def forget(self, request_id: str) -> None:
        """Drop a request that will never finish (its arrival stays counted)."""
        self._open.pop(request_id, None)

    def position(self) -> tuple[Tier, float] | None:
        """(tier, quantile in [0, 1)) where the percentile lies, from the arrivals seen."""
        if not self._total:
            return None
        tail = 1.0 - self.percentile / 100.0
        above = 0.0
        for t, (n, _, _) in sorted(self._seen.items(), key=lambda kv: -kv[1][1]):
            share = n / self._total
            if above + share >= tail:
                return t, max(0.0, 1.0 - (tail - above) / share)
            above += share
        return None

    def load(self, wide: Tier | None = None) -> float:
        """Devices the arrivals seen keep busy in the fluid limit: Σ rate × work at degree
        1, tier ``wide`` at its least parallel degree (inf before two arrival times)."""
        span = self.latest - self.first
        if span <= 0:
            return float("inf")
        return sum(n * (w if t == wide else s) for t, (n, s, w) in self._seen.items()) / span

    def goals(self) -> dict[Tier, float]:
        """Tier → goal latency (s): the quantile of its measured latencies (one tier at
        most; none before ``min_samples`` of it, or ``window`` if fewer, finished, nor while
        ``load`` with that tier wide exceeds ``devices``)."""
        pos = self.position()
        if pos is None:
            return {}
        t, q = pos
        if self.devices > 0 and self.load(t) > self.devices:
            return {}
        lat = self._lat.get(t)
        if lat is None or len(lat[1]) < min(self.min_samples, self.window):
            return {}
        ordered = lat[1]
        return {t: ordered[min(len(ordered) - 1, int(q * len(ordered)))]}
