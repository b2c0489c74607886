"""The priority rules of ``slo``, as pure functions over its candidates: which request to set
aside when a deadline prefix overruns, which priority-0 request to run early, and in what
order late requests run. Each candidate is a ``Candidate``: the request, its remaining work
``rem`` (s), one step ``tau`` (s), the encode ``enc`` still ahead of it (0 once started) and
its decode ``dec`` (s), and — for on-time ones — its ``slack`` (s of capacity left
after everything due up to it) and ``guard`` (the least slack among those due before it)."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from ..request import Request, RequestStatus

INF = float("inf")

#: A give-up heap entry: (−remaining / weight**power, deadline rank, candidate).
HeapEntry = tuple[float, int, "Candidate"]


@dataclass(slots=True)
class Candidate:
    """One request as ``slo`` sees it in a decision (times in seconds)."""

    item: RequestStatus | Request
    req: Request
    rem: float
    tau: float
    tokens: int
    enc: float = 0.0
    dec: float = 0.0
    slack: float = INF
    guard: float = INF
    late: bool = False


def set_aside(
    heap: list[HeapEntry],
    excess: float,
    shield0: bool,
    spare0: Callable[[Candidate], float] | None = None,
) -> Candidate | None:
    """Pop the request to give up: the most remaining work per weight**power. With
    ``shield0``, a priority-0 pick is swapped, one miss for one miss, for the lower-priority
    request with the most work per weight whose remaining work alone covers ``excess`` (s);
    failing that, for an equal priority-0 one due later (the earlier one is nearer done).
    ``spare0`` (a function of the priority-0 pick, or None): the seconds of the overrun that
    are forecast lower-priority arrivals due before the pick — work the same swap will give
    up for it once it has arrived; when no present lower-priority request can be swapped and
    ``excess`` is within it, nobody is set aside, not even an equal priority-0 one (None,
    the heap unchanged)."""
    victim = heapq.heappop(heap)
    if not shield0 or victim[2].req.priority != 0:
        return victim[2]
    swaps = [e for e in heap if e[2].req.priority > 0 and e[2].rem >= excess]
    if swaps:
        swap = min(swaps)
    elif spare0 is not None and excess <= spare0(victim[2]):
        heapq.heappush(heap, victim)
        return None
    else:
        swaps = [e for e in heap if e[0] == victim[0] and e[1] > victim[1]]
        if not swaps:
            return victim[2]
        swap = max(swaps)
    heap.remove(swap)
    heap.append(victim)
    heapq.heapify(heap)
    return swap[2]


def rescued(ontime: list[Candidate], fraction: float, guard_steps: float) -> Candidate | None:
    """The first priority-0 request (``ontime`` in serving order) whose own slack is below
    ``fraction`` × its remaining work, if every on-time request served before it keeps slack
    for ``guard_steps`` of its steps; else None."""
    for c in ontime:
        if c.req.priority == 0 and c.slack < fraction * c.rem:
            return c if c.guard >= guard_steps * c.tau else None
    return None


def late_order(now: float, c: Candidate, rank: float) -> tuple:
    """Sort key of late requests in spare time: those that could still finish in time alone
    (given up for the forecast or for others, not yet lost) first; then by ``rank`` (their
    place in the late lane)."""
    lost = now + c.rem > c.req.deadline
    return (lost, rank, c.req.arrival)
