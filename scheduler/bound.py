"""An offline bound: the fewest deadline misses *any* schedule must have on a trace.

For a time window [t1, t2], the requests that arrive at or after t1 and are due by t2 need
their work done inside it. If their work exceeds t2 − t1, some of them must miss; at least
as many as it takes, dropping the largest first, to bring the rest within the window.
Windows that do not overlap in time cannot share device time, so their counts add up: the
best set of disjoint windows (weighted interval scheduling) gives a lower bound on misses
that holds for every policy, clairvoyant ones included, and hence an upper bound on SLO
attainment. Each request's work is its *cheapest* possible per-request time (its FLOPs at
full utilisation, no per-step floor), so the bound stays valid with any batching.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from .cost import CostModel
from .request import Request


def min_work(request: Request, cost: CostModel) -> float:
    """The least device seconds the request can cost: encode + decode + its steps at the
    cost model's lower bound on a request's share of any batch (``min_step_share``)."""
    share = cost.min_step_share(request.model, cost.tokens(request))
    return cost.encode_time(request) + request.steps * share + cost.decode_time(request)


def min_misses(requests: Sequence[Request], cost: CostModel, horizon: float | None = None) -> int:
    """A lower bound on the number of requests that miss their deadline under any policy.

    ``horizon`` caps window length (s); default 4× the longest SLO window.
    """
    jobs = sorted(
        ((r.arrival, r.deadline, min_work(r, cost)) for r in requests), key=lambda j: j[0]
    )
    if horizon is None:
        horizon = 4 * max(d - a for a, d, _ in jobs)
    windows: list[tuple[float, float, int]] = []
    for i, (t1, _, _) in enumerate(jobs):
        inside = sorted(
            (j for j in jobs[i:] if j[0] >= t1 and j[1] <= t1 + horizon), key=lambda j: j[1]
        )
        if not inside:
            continue
        works: list[float] = []
        total = 0.0
        for k, (_, t2, p) in enumerate(inside):
            bisect.insort(works, p)
            total += p
            if k + 1 < len(inside) and inside[k + 1][1] == t2:
                continue
            excess = total - (t2 - t1)
            drops = 0
            while excess > 1e-9:
                excess -= works[-1 - drops]
                drops += 1
            if drops:
                windows.append((t1, t2, drops))
    return _best_disjoint(windows)


def _best_disjoint(windows: list[tuple[float, float, int]]) -> int:
    """Max total weight of windows whose time spans do not overlap (classic DP)."""
    windows.sort(key=lambda w: w[1])
    ends = [w[1] for w in windows]
    best = [0] * (len(windows) + 1)
    for k, (t1, _, w) in enumerate(windows):
        prev = bisect.bisect_right(ends, t1, 0, k)
        best[k + 1] = max(best[k], best[prev] + w)
    return best[-1]


def clairvoyant_misses(requests: Sequence[Request], cost: CostModel) -> int:
    """Misses of an offline schedule that knows every arrival in advance (a reference point
    between the online policies and ``min_misses``; not optimal).

    Preemptive earliest-deadline-first on one device over standalone (batch-1) times; when a
    request would miss, the largest-work request of that busy period due no later than it is
    set aside (it runs in leftover time and counts as a miss), and the schedule is redone.
    """
    jobs = sorted(
        ((r.arrival, r.deadline, r.standalone_s, i) for i, r in enumerate(requests)),
        key=lambda j: (j[0], j[1]),
    )
    removed: set[int] = set()
    while True:
        miss = _edf_first_miss([j for j in jobs if j[3] not in removed])
        if miss is None:
            return len(removed)
        busy_start, due = miss
        pool = [j for j in jobs if j[3] not in removed and j[0] >= busy_start and j[1] <= due]
        removed.add(max(pool, key=lambda j: (j[2], j[0]))[3])


def _edf_first_miss(jobs: list[tuple[float, float, float, int]]) -> tuple[float, float] | None:
    """Run preemptive EDF; return (start of the busy period, deadline) of the first miss."""
    import heapq

    heap: list[tuple[float, float, int]] = []
    now, k, busy_start = 0.0, 0, 0.0
    rem: dict[int, float] = {}
    while k < len(jobs) or heap:
        if not heap:
            now = max(now, jobs[k][0])
            busy_start = now
        while k < len(jobs) and jobs[k][0] <= now:
            a, d, p, i = jobs[k]
            rem[i] = p
            heapq.heappush(heap, (d, a, i))
            k += 1
        d, a, i = heap[0]
        next_arrival = jobs[k][0] if k < len(jobs) else float("inf")
        run = min(rem[i], next_arrival - now)
        now += run
        rem[i] -= run
        if rem[i] <= 1e-12:
            heapq.heappop(heap)
            if now > d + 1e-9:
                return busy_start, d
    return None
