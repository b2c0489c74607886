"""The fewest deadline misses a one-device schedule can have, solved exactly for the
preemptive relaxation, optionally under flow limits: for each pair (T, e) of ``limits``, at
most e flows above T s (e.g. ``((P, k),)`` with k = ``tail_bound.allowed_above(N, 99)``: a
necessary condition for P99 ≤ P; ``((M, 0),)``: every flow ≤ M).

**The model.** One device; request j arrives at ``A_j``, is due at ``D_j`` and needs ``p_j``
device seconds; the device may switch requests at any instant (a relaxation of switching at
step or block boundaries). The limits' thresholds T_1 < … < T_m cut flows into *tiers*
(tier 0: flow ≤ T_1; tier k: T_k < flow ≤ T_{k+1}; the last up to the first threshold that
allows none, else unbounded), and at most e_k requests may be in tier k or above. A
schedule gives each request one *option* — its tier and whether it is on time — with a
latest finish ``e`` (its effective deadline): on time in a tier of upper end U,
``min(D, A + U)`` (only where the request can be on time with a flow above the tier's lower
end); late in it, ``A + U`` (only where ``A + U > D``). Every schedule that keeps the
limits gives each request an option whose ``e`` it meets, so its misses are at least the
optimum of choosing options below; conversely a choice whose deadlines one device can meet
is a schedule with that many misses that keeps the limits.

**Feasibility** of a set of effective deadlines on one preemptive device is Horn's
condition: for every release time r and every t ≥ r, the work of the requests arriving at
or after r with ``e ≤ t`` is at most ``t − r`` (necessary: all of it runs inside [r, t];
sufficient: EDF meets every deadline when it holds). So the optimum is a 0/1 program — one
binary per (request, option), one option per request, a count row per tier, a Horn row per
interval — minimising the late options. Horn rows are added lazily: solve with the rows so
far, run preemptive EDF on the chosen deadlines, add the rows of the intervals violated at
EDF's first miss, repeat. Every solve is a lower bound (some rows left out only relax the
program); the first choice EDF meets is optimal, so the result is exact. The program is
solved by HiGHS through ``scipy.optimize.milp`` (the ``bounds`` extra); with a solve time
limit hit, the solver's dual bound (rounded up) is returned, flagged ``optimal=False``.

**Works.** ``work="standalone"``: each request's batch-1 time (the bound is then exact for
schedules that run one request per step, up to the preemption instants). For schedules
that pack steps, ``"co-present"`` / ``"co-present-proportional"`` charge each option the
least share of a step it can have with the requests that can be present beside it
(``tail_bound.co_present_works`` with the lowest threshold and its count as the tail limit
and the unbounded tier's start as the maximum: on-time options its on-time work, late ones
in tier 0 its tail work, later tiers its maximum work — each a window that holds the
option's): each packed step's time is
charged once over its members, so Horn's condition holds for those charges too, and the
optimum is a lower bound on the misses of every schedule, packed or not (no longer exact).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .cost import CostModel
from .request import Request

INF = math.inf
#: ``work`` kinds of ``min_misses_exact`` (module docstring).
EXACT_WORK_KINDS = ("standalone", "co-present", "co-present-proportional")


class Infeasible(ValueError):
    """No schedule keeps the flow limits asked for (a ``ValueError``: the limits are the
    caller's input)."""


@dataclass(slots=True)
class ExactBound:
    """``min_misses_exact``'s answer: ``misses``, a lower bound on the misses of every
    schedule the model covers — the program's optimum when ``optimal`` (with
    ``work="standalone"`` then the fewest misses a preemptive batch-1 schedule can have),
    else the solver's dual bound at its time limit; the Horn rows the program needed
    (``cuts``) and the solves it took (``solves``)."""

    misses: int
    optimal: bool
    cuts: int
    solves: int


@dataclass(slots=True)
class _Option:
    job: int
    due: float  # effective deadline (s)
    late: bool
    tier: int
    work: float  # device s charged in a Horn row


def _milp():
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_matrix
    except ImportError as e:  # optional: the "bounds" extra
        raise ImportError(
            "min_misses_exact needs scipy (HiGHS MILP): pip install 'ditmem[bounds]'"
        ) from e
    return milp, LinearConstraint, Bounds, csr_matrix


def min_misses_exact(
    requests: Sequence[Request],
    cost: CostModel | None = None,
    *,
    work: str = "standalone",
    limits: Sequence[tuple[float, int]] = (),
    time_limit_s: float = 120.0,
) -> ExactBound:
    """The fewest misses of ``requests`` (deadlines and ``standalone_s`` set) on one
    preemptive device with, for each (T, e) of ``limits``, at most e flows above T s (module
    docstring). ``cost`` is needed for the co-present works. ``time_limit_s`` bounds each
    solve. ValueError on bad arguments or when no schedule keeps the limits."""
    if work not in EXACT_WORK_KINDS:
        raise ValueError(f"work must be one of {EXACT_WORK_KINDS}, got {work!r}")
    if any(r.deadline is None or r.standalone_s is None for r in requests):
        raise ValueError("every request needs its deadline and standalone_s (assign_deadline)")
    if work == "standalone":
        def work_of(j: int, tier: int, late: bool, cap: float) -> float:
            return requests[j].standalone_s
    else:
        if cost is None:
            raise ValueError(f"work={work!r} needs the cost model")
        from .tail_bound import co_present_works

        bounds, counts, most = _tiers(limits)
        tail_flow, exempt = (bounds[0], counts[0]) if bounds else (most, 0)
        works = co_present_works(requests, cost, work, most, tail_flow, exempt)

        def work_of(j: int, tier: int, late: bool, cap: float) -> float:
            if not late:
                return works.on_time[j]
            return works.tail[j] if tier == 0 else works.max[j]
    return min_misses_with(requests, work_of, limits=limits, time_limit_s=time_limit_s)


def min_misses_with(
    requests: Sequence[Request],
    work_of: Callable[[int, int, bool, float], float],
    *,
    limits: Sequence[tuple[float, int]] = (),
    time_limit_s: float = 120.0,
) -> ExactBound:
    """``min_misses_exact`` with the works given: ``work_of(j, tier, late, cap)`` is the
    device-seconds (of a machine of speed 1) request j needs at least when it finishes in
    tier ``tier``, late or not, with its flow at most ``cap`` s (inf in the unbounded
    tier); inf where it cannot finish within ``cap``. Sound for any model where a request's
    least work is a nonincreasing function of its flow limit and the machine does at most
    t − r of work in [r, t] (e.g. D devices with every work ÷ D: ``node.exact_bound``)."""
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s!r}")
    bounds, counts, most = _tiers(limits)
    if any(r.deadline is None for r in requests):
        raise ValueError("every request needs its deadline (assign_deadline)")
    if not requests:
        return ExactBound(0, True, 0, 0)
    options = _options(requests, work_of, bounds, most)
    if len({o.job for o in options}) < len(requests):  # someone cannot finish within any
        raise Infeasible("no schedule keeps the flow limits")
    return _solve(np.array([r.arrival for r in requests], float), options, len(requests),
                  counts, time_limit_s)


def _tiers(limits) -> tuple[list[float], list[int], float]:
    """Thresholds T_1 < … < T_m that allow some flows above, the count allowed at or above
    each tier (nonincreasing: a limit also caps every higher threshold), and the largest
    flow (the first threshold allowing none; inf)."""
    most = INF
    pairs = []
    for flow, count in limits:
        if not flow > 0:
            raise ValueError(f"limits: each flow must be > 0 s, got {flow!r}")
        if count < 0 or int(count) != count:
            raise ValueError(f"limits: each count must be an integer >= 0, got {count!r}")
        if count == 0:
            most = min(most, flow)
        else:
            pairs.append((flow, int(count)))
    bounds, counts = [], []
    for flow, count in sorted(pairs):
        if flow >= most:
            break
        if counts and count >= counts[-1]:
            continue  # no tighter than a lower threshold's count
        if bounds and flow == bounds[-1]:
            counts[-1] = min(counts[-1], count)
            continue
        bounds.append(flow)
        counts.append(count)
    return bounds, counts, most


def _options(requests, work_of, bounds, most) -> list[_Option]:
    uppers = [*bounds, most]
    out = []
    for j, r in enumerate(requests):
        a, d = r.arrival, r.deadline
        for k, upper in enumerate(uppers):
            lower = bounds[k - 1] if k else -INF
            if d > a + lower:  # on time with a flow in (lower, upper]
                due = min(d, a + upper)
                w = work_of(j, k, False, due - a)
                if w < INF:
                    out.append(_Option(j, due, False, k, w))
            if a + upper > d:
                w = work_of(j, k, True, upper)
                if w < INF:
                    out.append(_Option(j, a + upper, True, k, w))
    return out


def _solve(arrival: np.ndarray, options: list[_Option], n: int, counts: list[int],
           time_limit_s: float) -> ExactBound:
    milp, LinearConstraint, Bounds, csr_matrix = _milp()
    m = len(options)
    job = np.array([o.job for o in options])
    due = np.array([o.due for o in options])
    work = np.array([o.work for o in options])
    cost = np.array([1.0 if o.late else 0.0 for o in options])
    tier = np.array([o.tier for o in options])
    opt_arrival = arrival[job]
    cuts: list[tuple[float, float]] = []
    seen: set[tuple[float, float]] = set()
    solves = 0
    while True:
        rows, cols, vals, lo, hi = [], [], [], [], []
        rows += list(job)
        cols += list(range(m))
        vals += [1.0] * m
        lo += [1.0] * n
        hi += [1.0] * n
        r = n
        for k, count in enumerate(counts, start=1):  # at most count in tier k or above
            idx = np.flatnonzero(tier >= k)
            rows += [r] * len(idx)
            cols += list(idx)
            vals += [1.0] * len(idx)
            lo.append(0.0)
            hi.append(float(count))
            r += 1
        for start, end in cuts:
            idx = np.flatnonzero((opt_arrival >= start) & (due <= end) & (work > 0))
            rows += [r] * len(idx)
            cols += list(idx)
            vals += list(work[idx])
            lo.append(-INF)
            hi.append(end - start)
            r += 1
        a = csr_matrix((vals, (rows, cols)), shape=(r, m))
        res = milp(cost, constraints=LinearConstraint(a, lo, hi), integrality=np.ones(m),
                   bounds=Bounds(0, 1), options={"time_limit": time_limit_s})
        solves += 1
        if res.x is None:
            if res.status == 1:  # time limit without a solution: no bound from it
                raise RuntimeError(f"min_misses_exact: no solution within {time_limit_s} s")
            raise Infeasible("no schedule keeps the flow limits")
        if res.status != 0:
            bound = getattr(res, "mip_dual_bound", None)
            misses = math.ceil(bound - 1e-6) if bound is not None else 0
            return ExactBound(misses, False, len(cuts), solves)
        chosen = np.flatnonzero(res.x > 0.5)
        deadlines = np.full(n, INF)
        works = np.zeros(n)
        deadlines[job[chosen]] = due[chosen]
        works[job[chosen]] = work[chosen]
        new = [c for c in horn_violations(arrival, works, deadlines) if c not in seen]
        if not new:
            return ExactBound(int(round(res.fun)), True, len(cuts), solves)
        seen.update(new)
        cuts += new


def horn_violations(arrival: np.ndarray, work: np.ndarray, due: np.ndarray,
                    most: int = 8) -> list[tuple[float, float]]:
    """Run preemptive EDF on one device (``arrival``, ``work``, ``due``: s, per request);
    at its first miss, return up to ``most`` intervals (r, t) — r a release time, t the
    missed deadline — whose work (arrivals ≥ r, deadlines ≤ t) exceeds t − r, most
    overloaded first; [] when EDF meets every deadline."""
    from .bound import edf_first_miss

    order = np.argsort(arrival, kind="stable")
    miss = edf_first_miss([(float(arrival[j]), float(due[j]), float(work[j]), int(j))
                            for j in order])
    return [] if miss is None else _violated(arrival, work, due, miss[1], most)


def _violated(arrival, work, due, t, most):
    inside = due <= t + 1e-12
    starts = np.unique(arrival[arrival <= t])
    order = np.argsort(arrival, kind="stable")
    a_sorted, w_sorted = arrival[order], np.where(inside[order], work[order], 0.0)
    suffix = np.concatenate([np.cumsum(w_sorted[::-1])[::-1], [0.0]])
    load = suffix[np.searchsorted(a_sorted, starts, side="left")]
    excess = load - (t - starts)
    bad = np.flatnonzero(excess > 1e-9)
    bad = bad[np.argsort(-excess[bad])][:most]
    return [(float(starts[b]), float(t)) for b in bad]


@dataclass(slots=True)
class PercentileBound:
    """``min_misses_percentile``'s answer: every schedule whose ``q``-th flow percentile is
    ≤ the value misses at least ``lower``; ``upper`` (batch-1 works only, else None; None too
    where no grid point is feasible) is the misses of a preemptive schedule that keeps it."""

    lower: int
    upper: int | None
    optimal: bool


def min_misses_percentile(
    requests: Sequence[Request],
    cost: CostModel | None = None,
    *,
    q: float,
    value: float,
    work: str = "standalone",
    max_flow: float = INF,
    cells: int = 8,
    time_limit_s: float = 120.0,
) -> PercentileBound:
    """The fewest misses with the ``q``-th percentile of the flows (``metrics.percentile``:
    linear interpolation at rank h = (N − 1) q / 100, lo = ⌊h⌋, f = h − lo) at most
    ``value`` s, and every flow ≤ ``max_flow``.

    The percentile is (1 − f) x + f y with x, y the flows of rank lo and lo + 1, so it is ≤
    ``value`` iff y ≤ Y(x) = (value − (1 − f) x) / f. Cut x's range [0, value] into
    ``cells`` (half of them evenly over [value / 2, value]): a schedule with x in [a, b] has at
    most N − 1 − lo flows above b and at most N − 2 − lo above Y(a), so the least
    ``min_misses_exact`` over the cells is a lower bound; one with at most N − 1 − lo flows
    above a and N − 2 − lo above Y(a) has the percentile ≤ (1 − f) a + f Y(a) = ``value``,
    so the least over the cell edges (batch-1 works: a real schedule) is reached. (With
    f = 0, the rank-lo flow alone decides: exact at x = ``value``.)"""
    top = [] if max_flow == INF else [(max_flow, 0)]

    def solve(limits) -> ExactBound:
        return min_misses_exact(requests, cost, work=work, limits=[*limits, *top],
                                time_limit_s=time_limit_s)

    return percentile_search(len(requests), q, value, solve, cells=cells,
                             reaches=work == "standalone")


def percentile_search(
    n: int,
    q: float,
    value: float,
    solve: Callable[[list[tuple[float, int]]], ExactBound],
    *,
    cells: int = 8,
    reaches: bool = False,
) -> PercentileBound:
    """``min_misses_percentile``'s cells for any exact solver: ``solve(limits)`` is the
    fewest misses of the ``n`` requests under ``limits`` (``Infeasible`` where
    none keeps them); ``reaches``: its optimum is a schedule (then ``upper`` is set)."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q!r}")
    if not value > 0:
        raise ValueError(f"value must be > 0 s, got {value!r}")
    if cells < 1:
        raise ValueError(f"cells must be >= 1, got {cells!r}")
    if n == 0:
        return PercentileBound(0, 0, True)
    h = (n - 1) * q / 100.0
    lo = math.floor(h)
    f = h - lo
    above_x, above_y = n - 1 - lo, max(0, n - 2 - lo)

    def attempt(limits) -> ExactBound | None:
        try:
            return solve(limits)
        except Infeasible:
            return None

    if f == 0 or above_x == 0:
        got = attempt([(value, above_x)])
        if got is None:
            raise Infeasible("no schedule keeps the flow limits")
        return PercentileBound(got.misses, got.misses if reaches else None, got.optimal)

    def y_of(x: float) -> float:
        return (value - (1 - f) * x) / f

    half = max(1, cells // 2)
    edges = sorted({0.0, *(value / 2 * (1 + i / half) for i in range(half + 1))})
    if cells - half > 1:
        edges = sorted({*edges, *(value / 2 * i / (cells - half) for i in range(cells - half))})
    lowers, optimal = [], True
    for a, b in zip(edges, edges[1:], strict=False):
        got = attempt([(b, above_x), (y_of(a), above_y)])
        if got is not None:
            lowers.append(got.misses)
            optimal &= got.optimal
    if not lowers:
        raise Infeasible("no schedule keeps the flow limits")
    upper = None
    if reaches:
        reached = [g.misses for a in edges if a > 0
                   if (g := attempt([(a, above_x), (y_of(a), above_y)])) is not None]
        upper = min(reached, default=None)
    return PercentileBound(min(lowers), upper, optimal)
