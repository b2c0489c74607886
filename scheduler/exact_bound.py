"""The fewest deadline misses a one-device schedule can have, solved exactly for the
preemptive relaxation, optionally with a tail limit ("at most ``exempt`` flows above
``tail_flow``", e.g. P99 no higher than FIFO's) and a flow limit (every flow ≤ ``max_flow``).

**The model.** One device; request j arrives at ``A_j``, is due at ``D_j`` and needs ``p_j``
device seconds; the device may switch requests at any instant (a relaxation of switching at
step or block boundaries). A schedule gives each request one of four *options* by where it
finishes, each with a latest finish ``e`` (its effective deadline):

* on time and within the tail limit: ``e = min(D, A + T)``;
* on time, exempt from the tail limit: ``e = min(D, A + M)`` (only when ``D > A + T``);
* late, within the tail limit: ``e = A + T`` (only when ``A + T > D``);
* late and exempt: ``e = A + M``.

(T: ``tail_flow``, M: ``max_flow``, both default infinity.) At most ``exempt`` requests take
an exempt option. Every schedule with at most ``exempt`` flows above T and none above M
gives each request one option whose ``e`` it meets, so its misses are at least the optimum
of choosing options below; conversely a choice whose deadlines one device can meet is a
schedule with exactly that many misses.

**Feasibility** of a set of effective deadlines on one preemptive device is Horn's
condition: for every release time r and every t ≥ r, the work of the requests arriving at
or after r with ``e ≤ t`` is at most ``t − r`` (necessary: all of it runs inside [r, t];
sufficient: EDF meets every deadline when it holds). So the optimum is a 0/1 program — one
binary per (request, option), one option per request, the exemption budget, a Horn row per
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
(``tail_bound.co_present_works``: on-time options its on-time work, late ones within the
tail limit its tail work, late exempt ones its maximum work): each packed step's time is
charged once over its members, so Horn's condition holds for those charges too, and the
optimum is a lower bound on the misses of every schedule, packed or not (no longer exact).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .cost import CostModel
from .request import Request

INF = math.inf
#: ``work`` kinds of ``min_misses_exact`` (module docstring).
EXACT_WORK_KINDS = ("standalone", "co-present", "co-present-proportional")


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
    exempt: bool
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
    tail_flow: float = INF,
    exempt: int = 0,
    max_flow: float = INF,
    time_limit_s: float = 120.0,
) -> ExactBound:
    """The fewest misses of ``requests`` (deadlines and ``standalone_s`` set) on one
    preemptive device with at most ``exempt`` flows above ``tail_flow`` s and none above
    ``max_flow`` s (module docstring). ``cost`` is needed for the co-present works.
    ``time_limit_s`` bounds each solve. ValueError on bad arguments or when no schedule keeps
    the flow limits."""
    if work not in EXACT_WORK_KINDS:
        raise ValueError(f"work must be one of {EXACT_WORK_KINDS}, got {work!r}")
    if not (tail_flow > 0 and max_flow >= tail_flow):
        raise ValueError(f"need 0 < tail_flow <= max_flow, got {tail_flow!r}, {max_flow!r}")
    if exempt < 0:
        raise ValueError(f"exempt must be >= 0, got {exempt!r}")
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s!r}")
    if any(r.deadline is None or r.standalone_s is None for r in requests):
        raise ValueError("every request needs its deadline and standalone_s (assign_deadline)")
    if not requests:
        return ExactBound(0, True, 0, 0)
    options = _options(requests, cost, work, tail_flow, exempt, max_flow)
    return _solve(np.array([r.arrival for r in requests], float), options, len(requests),
                  exempt, time_limit_s)


def _options(requests, cost, work, tail_flow, exempt, max_flow) -> list[_Option]:
    if work == "standalone":
        on_time = tail = most = [r.standalone_s for r in requests]
    else:
        if cost is None:
            raise ValueError(f"work={work!r} needs the cost model")
        from .tail_bound import co_present_works

        works = co_present_works(requests, cost, work, max_flow, tail_flow, exempt)
        on_time, tail, most = works.on_time, works.tail, works.max
    out = []
    for j, r in enumerate(requests):
        a, d = r.arrival, r.deadline
        out.append(_Option(j, min(d, a + tail_flow), False, False, on_time[j]))
        if exempt and d > a + tail_flow:
            out.append(_Option(j, min(d, a + max_flow), False, True, on_time[j]))
        if a + tail_flow > d:
            out.append(_Option(j, a + tail_flow, True, False, tail[j]))
        if exempt and max_flow > tail_flow:
            out.append(_Option(j, a + max_flow, True, True, most[j]))
    return out


def _solve(arrival: np.ndarray, options: list[_Option], n: int, exempt: int,
           time_limit_s: float) -> ExactBound:
    milp, LinearConstraint, Bounds, csr_matrix = _milp()
    m = len(options)
    job = np.array([o.job for o in options])
    due = np.array([o.due for o in options])
    work = np.array([o.work for o in options])
    cost = np.array([1.0 if o.late else 0.0 for o in options])
    is_exempt = np.array([o.exempt for o in options])
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
        if exempt < m and is_exempt.any():
            idx = np.flatnonzero(is_exempt)
            rows += [r] * len(idx)
            cols += list(idx)
            vals += [1.0] * len(idx)
            lo.append(0.0)
            hi.append(float(exempt))
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
            raise ValueError("no schedule keeps the flow limits (exempt too small)")
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
    order = np.argsort(arrival, kind="stable")
    heap: list[tuple[float, int]] = []
    rem = work.astype(float).copy()
    now, k, n = 0.0, 0, len(order)
    while k < n or heap:
        if not heap:
            now = max(now, float(arrival[order[k]]))
        while k < n and arrival[order[k]] <= now:
            j = int(order[k])
            heapq.heappush(heap, (float(due[j]), j))
            k += 1
        d, j = heap[0]
        nxt = float(arrival[order[k]]) if k < n else INF
        run = min(rem[j], nxt - now)
        now += run
        rem[j] -= run
        if rem[j] <= 1e-12:
            heapq.heappop(heap)
            if now > d + 1e-9:
                return _violated(arrival, work, due, d, most)
    return []


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
