"""A FIFO shadow: when each request *would* finish under run-to-completion FIFO.

Fed every arrival in arrival order with its standalone work ``p`` (s: encode + steps alone
+ decode, from the cost model), :class:`FifoShadow` keeps ``replicas`` static replicas that
each run one request at a time to completion; an arrival goes to the replica free first and
finishes at ``f = max(A, free) + p``. That is exactly what ``fifo`` (``policies/fifo.py``)
does on one device with exact timings, and list-scheduling FIFO on ``replicas`` devices.

**Conservation** (one replica). Two schedules that are busy whenever work is left, fed the
same work, have the same remaining work at every instant; one that does the same requests
in less device time (packed steps cheaper than their members alone) has at most as much.
So at request i's arrival, with ``W`` the remaining standalone work of the requests before
it under *any* such schedule, ``A_i + W + p_i <= f_i`` (equality when the shadow is busy
and the schedule is not cheaper): a schedule that promises every request ``d2_i >= f_i``
and serves its promises as late as possible in arrival order always has room for the
newcomer's promise (``policies/tail_lane``). :meth:`FifoShadow.backlog` is the shadow's
``W``.

:class:`FlowBound` turns the shadow's flow times ``f_i − A_i`` into a nondecreasing budget
``F_i``: the running ``quantile`` (1 = the running maximum) of the flows seen so far,
never lowered. A promise ``d2_i = max(f_i, A_i + F_i)`` is then nondecreasing in arrival
order (``f_i`` is, on one replica), so arrival order is also promise order, and a schedule
keeping every promise has each flow ``<= max(own FIFO flow, F_i)``: its maximum at most
FIFO's maximum and, with ``quantile`` q, its q-quantile about FIFO's.

Pure Python; times are seconds on the engine clock.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from dataclasses import dataclass


@dataclass(slots=True)
class ShadowEntry:
    """One request in the shadow: its arrival, standalone work and FIFO finish (s)."""

    arrival: float
    work: float
    finish: float

    @property
    def flow(self) -> float:
        """Its flow time under FIFO, ``finish − arrival`` (s)."""
        return self.finish - self.arrival


class FifoShadow:
    """Run-to-completion FIFO on ``replicas`` identical static replicas (module docstring)."""

    def __init__(self, replicas: int = 1):
        if not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas must be a positive int, got {replicas!r}")
        self.replicas = replicas
        self._free = [-math.inf] * replicas  # a heap of the replicas' free times
        self._latest = -math.inf
        self._entries: dict[str, ShadowEntry] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def latest(self) -> float:
        """Arrival time of the last request added (-inf before any)."""
        return self._latest

    def add(self, request_id: str, arrival: float, work: float) -> ShadowEntry:
        """Queue a request behind everything added before (arrivals must not go back in
        time: ValueError); returns its entry, with its FIFO finish time."""
        if request_id in self._entries:
            raise ValueError(f"request {request_id!r} is already in the shadow")
        if not arrival >= self._latest:
            raise ValueError(
                f"arrival must not precede the last one ({self._latest}), got {arrival!r}"
            )
        if not work >= 0:
            raise ValueError(f"work must be >= 0, got {work!r}")
        start = max(arrival, self._free[0])
        entry = ShadowEntry(arrival, work, start + work)
        heapq.heapreplace(self._free, entry.finish)
        self._latest = arrival
        self._entries[request_id] = entry
        return entry

    def entry(self, request_id: str) -> ShadowEntry:
        """The shadow record of a request added earlier (KeyError if not)."""
        return self._entries[request_id]

    def forget(self, request_id: str) -> None:
        """Drop a request's record (finished or cancelled); the shadow's timeline keeps its
        work (FIFO would have spent it), so later finishes do not move."""
        self._entries.pop(request_id, None)

    def backlog(self, now: float) -> float:
        """Standalone work the shadow still has left at ``now``, over all replicas (s)."""
        return sum(max(0.0, t - now) for t in self._free)


class FlowBound:
    """A nondecreasing flow budget: the running ``quantile`` of the flows seen (1 = max),
    over the last ``memory`` of them, never lowered. ``start`` is the budget before any."""

    def __init__(self, quantile: float = 1.0, memory: int = 4096, start: float = 0.0):
        if not 0 < quantile <= 1:
            raise ValueError(f"quantile must be in (0, 1], got {quantile!r}")
        if not isinstance(memory, int) or memory < 1:
            raise ValueError(f"memory must be a positive int, got {memory!r}")
        self.quantile = quantile
        self._recent: deque[float] = deque(maxlen=memory)
        self._sorted: list[float] = []
        self._value = start

    @property
    def value(self) -> float:
        """The budget now (s)."""
        return self._value

    def see(self, flow: float) -> float:
        """Take one more flow time into account; returns the (possibly raised) budget."""
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._recent.append(flow)
        bisect.insort(self._sorted, flow)
        n = len(self._sorted)
        rank = min(n - 1, max(0, math.ceil(self.quantile * n) - 1))
        self._value = max(self._value, self._sorted[rank])
        return self._value
