"""Step 0 of node ``slo``: the FIFO promise (``guard``, off by default).

Every arrival is queued in a shadow of the best static FIFO deployment (``degree``: D / d
replicas of degree d, each request's predicted standalone time at d, run to completion;
``ditmem.scheduler.fifo_shadow``): its FIFO finish f_i and a promise ``max(f_i, A_i +
F_i)``, F_i the running ``quantile`` of the shadow's flows (1: the running maximum). A
promise kept for every request bounds the maximum latency by FIFO's (and, with quantile q,
each flow by max(own FIFO flow, F_i)). Promises are nondecreasing in arrival order, so an
as-late-as-possible list schedule at degree 1 of the started and the first ``window``
waiting requests by arrival, latest promise first on D devices (``margin`` on each
remaining time for timing error), gives each its latest start; a request whose latest
start falls within one of its steps is *critical* (:meth:`FifoPromise.critical`). Where
critical requests go, and at which degree, is the policy's choice (``slo.py``, step 0).

On a node work is not conserved exactly (a step at degree d > 1 costs more device-seconds
than at 1), so this is a check, not a proof: how often promises hold is measured. It keeps
the maximum under FIFO's at ρ 0.7 on 8 × h200 but costs attainment at high load and on
small nodes (docs/results/node.md, sessions 4, 25–27: on 2 and 4 h200 devices at ρ 0.7 it
keeps neither the attainment nor FIFO's maximum), hence off by default.

``floor`` f (0: off) raises each promise to at least A_i + f × the request's own time alone
at degree 1: early in a trace F_i is still low, and a 2048² promised its bare FIFO finish
is critical at once and takes devices from urgent smaller requests, which are then given up
(session 26). Near saturation FIFO's own backlog grows, each arrival's promise is its bare
FIFO finish and keeping them all runs FIFO's order (seed-mix ρ 0.92: 94.7 % against
99.95 % without the guard); ``load`` (0: off) stands the guard down while the load of the
last ``LOAD_WINDOW`` arrivals exceeds it (:meth:`FifoPromise.measured_load`).

Pure Python; times are seconds on the engine clock.
"""

from __future__ import annotations

import heapq
from collections import deque

from ...fifo_shadow import FifoShadow, FlowBound
from ..cost import NodeCost
from ..plan import NodeStatus, NodeView
from ..topology import Node

INF = float("inf")

#: arrivals behind the load estimate (``load``): at ρ 0.7 on 8 × h200 it reads 0.62-0.83
#: over 2,000-request traces, at ρ 0.9 0.79-1.07 (docs/results/node.md, "Session 26")
LOAD_WINDOW = 500


class FifoPromise:
    """The promises of step 0 (module docstring) and the load estimate that gates them.

    ``promises`` maps a request id to its promised finish (s); it is kept after the request
    finishes, to measure how many were kept."""

    def __init__(self, ncost: NodeCost, node: Node, *, degree: int = 1,
                 quantile: float = 1.0, margin: float = 0.05, floor: float = 0.0,
                 load: float = 0.0):
        if not floor >= 0.0:
            raise ValueError(f"guard_floor must be >= 0, got {floor}")
        if not load >= 0.0:
            raise ValueError(f"guard_load must be >= 0, got {load}")
        self.ncost, self.node = ncost, node
        self.degree, self.margin, self.floor, self.load = degree, margin, floor, load
        replicas = len(node.groups(degree))  # validates the degree against the node
        self.shadow = FifoShadow(replicas)
        self.flows = FlowBound(quantile)
        self.promises: dict[str, float] = {}
        #: (arrival, time alone at degree 1) of the last ``LOAD_WINDOW`` arrivals, their
        #: sum of times alone, and the longest SLO window seen (``measured_load``)
        self._seen: deque[tuple[float, float]] = deque(maxlen=LOAD_WINDOW)
        self._work = 0.0
        self._longest = 0.0

    def see(self, view: NodeView) -> None:
        """Queue the arrivals since the last call in the shadow and promise each a finish."""
        for r in view.waiting.arrived_after(self.shadow.latest):
            if r.id in self.shadow:
                continue
            alone = self.ncost.standalone(r, 1)
            if len(self._seen) == LOAD_WINDOW:
                self._work -= self._seen[0][1]
            self._seen.append((r.arrival, alone))
            self._work += alone
            self._longest = max(self._longest, r.deadline - r.arrival)
            shadow_s = alone if self.degree == 1 else self.ncost.standalone(r, self.degree)
            entry = self.shadow.add(r.id, r.arrival, shadow_s)
            budget = max(self.flows.see(entry.flow), self.floor * alone)
            self.promises[r.id] = max(entry.finish, r.arrival + budget)

    def measured_load(self, now: float) -> float:
        """The load of the last ``LOAD_WINDOW`` arrivals: their times alone at degree 1 ÷
        their span (at least the longest SLO window seen, so a burst at start-up does not
        read as overload) ÷ D; 0 before any."""
        if not self._seen:
            return 0.0
        span = max(now - self._seen[0][0], self._longest)
        return self._work / span / self.node.devices

    def acts(self, now: float) -> bool:
        """Whether step 0 acts now: always, or with ``load`` > 0 while the measured load is
        at most it."""
        return self.load <= 0 or self.measured_load(now) <= self.load

    def critical(self, now: float, pool: list) -> list:
        """The not-running members of ``pool`` (``slo``'s candidates: ``rem(k)``,
        ``step(k)``, ``req``, ``item``; running ones included, as they hold devices) whose
        as-late-as-possible start (list schedule at degree 1, latest promise first, on D
        devices) is within one step, by promise. Sets each member's ``promise``."""
        for c in pool:
            c.promise = self.promises.get(c.req.id, INF)
        pool = sorted(pool, key=lambda c: c.promise, reverse=True)
        free_until = [-INF] * self.node.devices  # negated: a max-heap of latest free times
        grow = 1.0 + self.margin
        out = []
        for c in pool:
            latest = -heapq.heappop(free_until)
            start = min(c.promise, latest) - c.rem(0) * grow
            heapq.heappush(free_until, -start)
            if start - now <= c.step(0) * grow and not (
                isinstance(c.item, NodeStatus) and c.item.running
            ):
                out.append(c)
        out.sort(key=lambda c: c.promise)
        return out

    def forget(self, request_id: str) -> None:
        """Drop a finished or cancelled request from the shadow (its promise stays)."""
        self.shadow.forget(request_id)
