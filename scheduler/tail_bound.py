"""An offline bound with a tail constraint: the fewest deadline misses any schedule must have
when, besides, every request must finish within ``max_flow`` of its arrival.

**FIFO and the maximum flow.** On one device with fixed processing times, run-to-completion
FIFO minimises the largest flow time ``max_i (C_i − A_i)``. Derivation: take FIFO's request
k of largest flow and the FIFO busy period it ends in, which starts at t1 with an arrival;
FIFO is busy over [t1, C_k] and runs exactly the requests arriving in [t1, A_k], so
``C_k = t1 + Σ_{t1 <= A_j <= A_k} p_j``. Any schedule has to do all of that work after t1,
so the last of those requests to finish, say j, ends at ``>= C_k`` and, as ``A_j <= A_k``,
has flow ``>= C_k − A_k`` — FIFO's maximum. (Packed steps break the premise: a schedule
that batches does less device work, which is the only way to beat FIFO's maximum.) So
"maximum flow no larger than FIFO's" asks for a schedule that is F_max-optimal up to
packing gains — in FIFO's worst busy period it must finish the requests that arrived up to
k by ``C_k``, which on its own takes the whole of [t1, C_k].

**The bound.** For a window [t1, t2], let K be the requests arriving at or after t1 that are
due by t2 (the ones that can be on time in it) and J those arriving at or after t1 whose
latest finish ``A + max_flow`` is by t2 (they *must* be done inside it). Relax every
arrival in the window to t1 and every latest finish to t2; any schedule then still has to
fit, in ``t2 − t1`` of device time, the on-time members of K by their deadlines and all of
J. Two consequences, each a lower bound on the misses among K:

* Moore–Hodgson on K alone (``bound.min_misses``' per-window rule, and its mirror image
  with deadlines relaxed instead: the tail constraint only removes schedules), and
* a knapsack: J's work ``M`` is spent in the window whatever happens, so the on-time
  members of K outside J fit in ``t2 − t1 − M``; at most the smallest ones that fit can be
  on time (exact for a count), and every other member of K \\ J misses.

Windows that do not overlap cannot share device time, and their K sets are disjoint, so the
best set of disjoint windows (each counted by the larger of its two numbers) bounds the
misses of every schedule whose flows all stay within ``max_flow`` — an upper bound on the
attainment any such schedule, clairvoyant ones included, can have. Per-request work is
``bound.min_work`` (the least the device can charge with any batching). When J's work alone
exceeds a window (``M > t2 − t1``), no schedule has all flows within ``max_flow``:
ValueError.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence

from .bound import _best_disjoint, moore_hodgson_windows, trace_work
from .cost import CostModel
from .request import Request


class _Fenwick:
    """Counts and work sums over positions (works sorted ascending)."""

    def __init__(self, works: list[float]):
        self.works = works
        self.n = len(works)
        self.cnt = [0] * (self.n + 1)
        self.sum = [0.0] * (self.n + 1)
        self.size = 1 << max(0, self.n.bit_length())

    def add(self, pos: int, sign: int) -> None:
        w = self.works[pos] * sign
        i = pos + 1
        while i <= self.n:
            self.cnt[i] += sign
            self.sum[i] += w
            i += i & -i

    def fit(self, cap: float) -> int:
        """How many of the present works, smallest first, fit in ``cap``."""
        pos, total, count = 0, 0.0, 0
        step = self.size
        while step:
            nxt = pos + step
            if nxt <= self.n and total + self.sum[nxt] <= cap + 1e-9:
                pos = nxt
                total += self.sum[nxt]
                count += self.cnt[nxt]
            step >>= 1
        return count


def min_misses_within(
    requests: Sequence[Request],
    cost: CostModel,
    max_flow: float | Mapping[str, float],
    horizon: float | None = None,
    *,
    work: str = "profile",
) -> int:
    """A lower bound on the misses of any schedule in which every request finishes within
    ``max_flow`` s of its arrival (one number, or one per request id) — see the module
    docstring. ``horizon`` caps window length (s; default the larger of 16 × the longest
    SLO window and 3 × the largest ``max_flow``); ``work`` as in ``bound.min_work``."""
    if not requests:
        return 0
    cost_of: Callable[[Request], float] = trace_work(requests, cost, work)
    if isinstance(max_flow, Mapping):
        missing = [r.id for r in requests if r.id not in max_flow]
        if missing:
            raise ValueError(f"max_flow has no entry for request {missing[0]!r}")
        flows = [float(max_flow[r.id]) for r in requests]
    else:
        flows = [float(max_flow)] * len(requests)
    if not all(f > 0 for f in flows):
        raise ValueError(f"max_flow must be > 0 s, got {min(flows)!r}")
    pairs = zip(requests, flows, strict=True)
    jobs = sorted(((r.arrival, r.deadline, cost_of(r), r.arrival + f) for r, f in pairs),
                  key=lambda j: j[0])
    if horizon is None:
        horizon = max(16 * max(d - a for a, d, _, _ in jobs), 3 * max(flows))
    found = moore_hodgson_windows([(a, d, p) for a, d, p, _ in jobs], horizon)
    found += _knapsack_windows(jobs, horizon)
    return _best_disjoint(found)


def _knapsack_windows(jobs: list, horizon: float) -> list[tuple[float, float, int]]:
    """For each window [t1, t2] starting at an arrival: the misses the knapsack forces
    (module docstring), recorded where they rise (jobs by arrival: (A, D, work, latest))."""
    order = sorted(range(len(jobs)), key=lambda n: (jobs[n][2], n))
    rank = {n: k for k, n in enumerate(order)}
    works = [jobs[n][2] for n in order]
    # events: (time, kind, job) — kind 0: the job becomes due (joins K), 1: it must be done
    events = sorted(
        [(j[1], 0, n) for n, j in enumerate(jobs)] + [(j[3], 1, n) for n, j in enumerate(jobs)]
    )
    times = [e[0] for e in events]
    out: list[tuple[float, float, int]] = []
    for i, (t1, _, _, _) in enumerate(jobs):
        tree = _Fenwick(works)
        due: set[int] = set()
        done: set[int] = set()
        mandatory, outside, best = 0.0, 0, 0
        k = bisect.bisect_left(times, t1)
        while k < len(events) and events[k][0] <= t1 + horizon:
            t2 = events[k][0]
            while k < len(events) and events[k][0] == t2:
                _, kind, n = events[k]
                k += 1
                if n < i:
                    continue
                if kind == 0:
                    due.add(n)
                    if n not in done:
                        tree.add(rank[n], 1)
                        outside += 1
                else:
                    done.add(n)
                    mandatory += jobs[n][2]
                    if n in due:
                        tree.add(rank[n], -1)
                        outside -= 1
            cap = t2 - t1 - mandatory
            if cap < -1e-9:
                raise ValueError(
                    f"no schedule keeps every flow within max_flow: {mandatory:.3f} s of work "
                    f"must be done in [{t1:.3f}, {t2:.3f}]"
                )
            misses = outside - tree.fit(cap)
            if misses > best:
                best = misses
                out.append((t1, t2, misses))
    return out
