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

**Co-present works** (``co_present_works``, ``min_misses_tail(work="co-present")``): a request
is credited only the packing it can get from the requests that can be present beside it,
given the tail limits (and a miss budget): its work differs by the case in which a window
charges it (on time, by its tail limit, by its maximum) — the soundness argument is in
``co_present_works``' docstring.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from .bound import MAX_BATCHES, _best_disjoint, moore_hodgson_windows, trace_work
from .cost import CostModel
from .request import Request

logger = logging.getLogger(__name__)

#: ``work`` kinds: ``bound.min_work``'s (``"profile"``, ``"flops"``: the least a request can
#: cost with any batching), ``"proportional"`` (``bound.trace_work``: each packed step split
#: in proportion to its members' batch-1 step times — any batching, tighter) and
#: ``"standalone"`` (its batch-1 time: the bound then holds for every schedule that runs one
#: request per step, with exact timings); ``"co-present"`` / ``"co-present-proportional"``
#: (``min_misses_tail`` only): the equal / proportional split with a request's packing
#: credit limited to the partners that can be present beside it (``co_present_works``).
TAIL_WORK_KINDS = ("profile", "flops", "proportional", "standalone", "co-present",
                   "co-present-proportional")


def _work_of(requests: Sequence[Request], cost: CostModel, work: str) -> Callable[[Request], float]:
    """Per-request device seconds the bound charges (``TAIL_WORK_KINDS``)."""
    if work == "standalone":
        return cost.standalone_time
    if work not in TAIL_WORK_KINDS:
        raise ValueError(f"work must be one of {TAIL_WORK_KINDS}, got {work!r}")
    if work in CO_PRESENT_SPLITS:
        raise ValueError(f"work={work!r} depends on the tail limits: min_misses_tail only")
    return trace_work(requests, cost, work)


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
    SLO window and 3 × the largest ``max_flow``); ``work``: ``TAIL_WORK_KINDS``."""
    if not requests:
        return 0
    cost_of: Callable[[Request], float] = _work_of(requests, cost, work)
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
    (module docstring), recorded where they rise (jobs by arrival: (A, D, work, latest), and
    optionally a fifth field: the work charged when the job must be done by its latest
    finish — the co-present works' J_M case; default the same work)."""
    rank, works = _work_ranks(jobs)
    # kind 0: the job becomes due (joins K), 1: it must be done
    sweep = _events(jobs, (1, 3))
    out: list[tuple[float, float, int]] = []
    for i, (t1, *_) in enumerate(jobs):
        tree = _Fenwick(works)
        due: set[int] = set()
        done: set[int] = set()
        mandatory, outside, best = 0.0, 0, 0
        for t2, ends in _window_ends(sweep, t1, horizon, i):
            for kind, n in ends:
                if kind == 0:
                    due.add(n)
                    if n not in done:
                        tree.add(rank[n], 1)
                        outside += 1
                else:
                    done.add(n)
                    mandatory += jobs[n][4] if len(jobs[n]) > 4 else jobs[n][2]
                    if n in due:
                        tree.add(rank[n], -1)
                        outside -= 1
            cap = t2 - t1 - mandatory
            if cap < -1e-9:
                raise _Infeasible(
                    f"no schedule keeps every flow within max_flow: {mandatory:.3f} s of work "
                    f"must be done in [{t1:.3f}, {t2:.3f}]"
                )
            misses = outside - tree.fit(cap)
            if misses > best:
                best = misses
                out.append((t1, t2, misses))
    return out


def _work_ranks(jobs: list) -> tuple[dict[int, int], list[float]]:
    """Jobs (``jobs[n][2]``: the work) ranked by work, ties by index: (rank of each job,
    the works in rank order), the layout of the windows' :class:`_Fenwick` trees."""
    order = sorted(range(len(jobs)), key=lambda n: (jobs[n][2], n))
    return {n: k for k, n in enumerate(order)}, [jobs[n][2] for n in order]


def _events(jobs: list, fields: tuple[int, ...]) -> tuple[list[tuple[float, int, int]],
                                                          list[float]]:
    """The windows' events, sorted: (time, kind, job) with kind k at time
    ``jobs[job][fields[k]]``; and their times (for bisection)."""
    events = sorted((j[f], kind, n) for kind, f in enumerate(fields) for n, j in enumerate(jobs))
    return events, [e[0] for e in events]


def _window_ends(sweep: tuple[list[tuple[float, int, int]], list[float]], t1: float,
                 horizon: float, first: int) -> Iterator[tuple[float, list[tuple[int, int]]]]:
    """The ends t2 of the windows [t1, t2] (event times in [t1, t1 + ``horizon``],
    ascending), each with its events as (kind, job), jobs before ``first`` left out.
    ``sweep``: what :func:`_events` returns."""
    events, times = sweep
    k = bisect.bisect_left(times, t1)
    while k < len(events) and events[k][0] <= t1 + horizon:
        t2 = events[k][0]
        ends = []
        while k < len(events) and events[k][0] == t2:
            _, kind, n = events[k]
            k += 1
            if n >= first:
                ends.append((kind, n))
        yield t2, ends


# ---- a joint tail constraint: every flow within a maximum, and at most a few above a --------
# ---- percentile threshold (module docstring of ``min_misses_tail``) -------------------------


def allowed_above(n: int, q: float) -> int:
    """How many of ``n`` values may exceed a threshold T while their ``q``-th percentile
    (``metrics.percentile``: linear interpolation at rank h = (n − 1) q / 100) stays ≤ T.

    The percentile is at least the order statistic x[⌊h⌋] (0-based, ascending), so it is ≤ T
    only if at least ⌊h⌋ + 1 values are ≤ T: at most n − 1 − ⌊h⌋ above (a necessary
    condition — exactly what a sound relaxation may assume)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    return n - 1 - int(((n - 1) * q) // 100)


def _exemption_points(budget: int) -> tuple[int, ...]:
    """Exemption counts at which a window's misses are evaluated: every count up to 4, then
    doubling, then the budget (between two points the next point's value is used: sound, as
    misses never rise with more exemptions)."""
    pts = list(range(min(budget, 4) + 1))
    e = 8
    while e < budget:
        pts.append(e)
        e *= 2
    if pts[-1] != budget:
        pts.append(budget)
    return tuple(pts)


def _exempt_windows(jobs: list, horizon: float, points: tuple[int, ...]) -> list:
    """Knapsack windows with exemptions. ``jobs`` by arrival: (A, D, work, A + tail_flow,
    A + max_flow, work in J_T, work in J_M) — the three works the same except for the
    co-present kinds (``co_present_works``: on time, by the tail limit, by the maximum;
    J_M's members are charged the last, J_T \\ J_M's the middle one). For each window
    [t1, t2] starting at an arrival: K = due by t2 (arrived ≥ t1), J_T = latest-by-tail
    ≤ t2, J_M = latest-by-max ≤ t2 (J_M ⊆ J_T). With e of
    J_T \\ J_M exempted (their limit becomes the maximum), the misses among K are at least
    ``|K \\ J_T| − fit(t2 − t1 − work(J_T) + the e largest works of J_T \\ J_M)``
    (derivation in ``min_misses_tail``). Returns (t1, t2, misses at each of ``points``,
    inf where even that many exemptions leave negative room), recorded where any rises."""
    rank, works = _work_ranks(jobs)
    # kinds: 0 due (joins K), 1 must be done by the tail limit, 2 ... by the maximum
    sweep = _events(jobs, (1, 3, 4))
    top = points[-1]
    out: list = []
    for i, (t1, *_) in enumerate(jobs):
        tree = _Fenwick(works)
        due: set[int] = set()
        tail_due: set[int] = set()
        free: list[float] = []  # works of J_T \ J_M, ascending
        mandatory, outside = 0.0, 0
        best = [0.0] * len(points)
        for t2, ends in _window_ends(sweep, t1, horizon, i):
            for kind, n in ends:
                if kind == 0:
                    due.add(n)
                    if n not in tail_due:
                        tree.add(rank[n], 1)
                        outside += 1
                elif kind == 1:
                    tail_due.add(n)
                    mandatory += jobs[n][5]
                    bisect.insort(free, jobs[n][5])
                    if n in due:
                        tree.add(rank[n], -1)
                        outside -= 1
                else:
                    free.pop(bisect.bisect_left(free, jobs[n][5]))
                    mandatory += jobs[n][6] - jobs[n][5]
            if not tail_due or outside == 0 and t2 - t1 - mandatory >= -1e-9:
                continue
            cap = t2 - t1 - mandatory
            row, bonus, taken = [], 0.0, 0
            for e in points:
                while taken < min(e, len(free)):
                    taken += 1
                    bonus += free[-taken]
                room = cap + bonus
                row.append(INF if room < -1e-9 else float(outside - tree.fit(room)))
            if row[-1] == INF:
                raise _Infeasible(
                    f"no schedule keeps every flow within its limits with {top} exemptions: "
                    f"{cap + bonus:.3f} s short in [{t1:.3f}, {t2:.3f}]")
            if any(w > b for w, b in zip(row, best, strict=True)):
                best = [max(w, b) for w, b in zip(row, best, strict=True)]
                out.append((t1, t2, tuple(row)))
    return out


INF = float("inf")


def _lagrange_weight(row: tuple[float, ...], points: tuple[int, ...], lam: float) -> float:
    """min over e of (a lower bound on the window's misses with e exemptions) + λ e."""
    best = row[0]
    for j in range(1, len(points)):
        best = min(best, row[j] + lam * (points[j - 1] + 1))
    return best


def tail_windows(
    requests: Sequence[Request],
    cost: CostModel,
    max_flow: float,
    tail_flow: float,
    exempt: int,
    horizon: float | None = None,
    *,
    work: str = "profile",
    misses: int | None = None,
) -> tuple[list, list, tuple[int, ...]]:
    """The windows ``min_misses_tail`` combines for one trace: (plain Moore–Hodgson windows
    (t1, t2, misses), exemption windows (t1, t2, misses per point), the exemption points).
    ``misses``: the co-present kinds' miss budget (``co_present_works``; None: none)."""
    if not 0 < tail_flow <= max_flow:
        raise ValueError(f"need 0 < tail_flow <= max_flow, got {tail_flow!r}, {max_flow!r}")
    if exempt < 0:
        raise ValueError(f"exempt must be >= 0, got {exempt!r}")
    if work in CO_PRESENT_SPLITS:
        uw = co_present_works(requests, cost, work, max_flow, tail_flow, exempt, misses)
        works = list(zip(uw.on_time, uw.tail, uw.max, strict=True))
    else:
        cost_of = _work_of(requests, cost, work)
        works = [(w, w, w) for w in map(cost_of, requests)]
    jobs = sorted(((r.arrival, r.deadline, on, r.arrival + tail_flow, r.arrival + max_flow,
                    tl, mx) for r, (on, tl, mx) in zip(requests, works, strict=True)),
                  key=lambda j: j[0])
    if horizon is None:
        horizon = max(16 * max(j[1] - j[0] for j in jobs), 3 * max_flow)
    plain = moore_hodgson_windows([(a, d, p) for a, d, p, *_ in jobs], horizon)
    plain += _knapsack_windows([(a, d, p, m, mx) for a, d, p, _, m, _, mx in jobs], horizon)
    points = _exemption_points(exempt)
    return plain, _exempt_windows(jobs, horizon, points), points


def min_misses_tail(
    traces: Sequence[Sequence[Request]],
    cost: CostModel,
    max_flow: float,
    tail_flow: float,
    exempt: int,
    horizon: float | None = None,
    *,
    work: str = "profile",
    lambdas: Sequence[float] | None = None,
) -> int:
    """A lower bound on the total misses over ``traces`` (independent runs, e.g. seeds) of
    any schedules in which every flow is ≤ ``max_flow`` s and, pooled over the traces, at
    most ``exempt`` flows are > ``tail_flow`` s (``allowed_above(N, 99)`` with the fifo P99
    as ``tail_flow``: "P99 and maximum no higher than fifo's"; ``max_flow=math.inf`` for
    the P99 alone). Works: ``bound.min_work`` (``work="profile"``/``"flops"``: any
    batching), ``"proportional"`` (any batching, ``bound``'s module docstring), or
    ``"standalone"``: batch-1 times, a bound for the schedules that run one request per
    step (and for any schedule whose packing gains are nil on the trace), or the co-present
    kinds (any batching, a request's partners limited to those that can be present beside
    it; ``co_present_works``: the least miss count consistent with its own miss budget).

    **Derivation.** Fix a schedule and its exempt set E (the requests with flow above
    ``tail_flow``, |E| ≤ ``exempt``). Take a window [t1, t2] starting at an arrival and, among
    the requests arriving at or after t1: K (due by t2), J_M (A + max_flow ≤ t2) and J_T
    (A + tail_flow ≤ t2). Every member of J_T \\ E and of J_M must be done inside the window;
    relax their arrivals to t1. With X = J_T \\ J_M, the work that must be done is
    ≥ work(J_T) − work(E ∩ X), so the other on-time members of K fit in
    room = t2 − t1 − work(J_T) + work(E ∩ X). Members of K ∩ J_T \\ E are counted as on time,
    and members of K ∩ E as on time too: that only lowers the count, because giving back one
    member with its work p and p more room lowers the knapsack's fit by at most one — so the
    misses among K are ≥ |K \\ J_T| − fit(room), and with |E ∩ X| = e, room is at most
    t2 − t1 − work(J_T) + the e largest works of X. Call that w(e) (non-increasing in e;
    evaluated at a few points, each e taking the next point's value). Plain Moore–Hodgson
    windows (``bound.min_misses``) hold with w constant. Windows disjoint in time have
    disjoint K and X sets, so for any set S of disjoint windows the schedule misses at least
    Σ_{S} w_i(e_i) with Σ e_i ≤ |E| ≤ ``exempt`` (pooled over traces). For any λ ≥ 0 that is
    ≥ Σ_{S} min_e (w_i(e) + λ e) − λ · exempt (Lagrangian relaxation of the budget), and the
    best S for each λ is the weighted-interval DP per trace. The bound is the largest of
    these over ``lambdas`` (default a grid), rounded up (misses are whole). ValueError when
    no schedule can keep the limits (a window short of room even with the whole budget).
    """
    if exempt < 0:
        raise ValueError(f"exempt must be >= 0, got {exempt!r}")
    found = _tail_misses(traces, cost, max_flow, tail_flow, exempt, horizon, work, lambdas)
    if work not in CO_PRESENT_SPLITS:
        return found
    total = sum(len(t) for t in traces)
    # from this budget on the works no longer change (a step's partners beyond the tight
    # ends are capped at max_batch − 1), so neither does the bound
    flat = max(0, max(cost.max_batch(r.model) for t in traces for r in t) - 1 - exempt)
    for budget in range(found, total):
        try:
            got = _tail_misses(traces, cost, max_flow, tail_flow, exempt, horizon, work,
                               lambdas, budget)
        except _Infeasible:
            if budget >= flat:
                return total  # and so for every larger budget
            continue  # no covered schedule with at most ``budget`` misses
        logger.debug("min_misses_tail: budget %d gives %d", budget, got)
        if got <= budget:
            return budget
        if budget >= flat:
            return min(got, total)  # the least budget >= this one that LB(budget) allows
    return total


def _tail_misses(traces, cost, max_flow, tail_flow, exempt, horizon, work, lambdas,
                 misses: int | None = None) -> int:
    """``min_misses_tail``'s Lagrangian bound for one set of works (``misses``: the
    co-present miss budget)."""
    per_trace = [tail_windows(t, cost, max_flow, tail_flow, exempt, horizon, work=work,
                              misses=misses) for t in traces if t]
    if not per_trace:
        return 0
    top = max([w[2] for pl, _, _ in per_trace for w in pl]
              + [x for _, ex, _ in per_trace for w in ex for x in w[2] if x < INF] + [0.0])
    if lambdas is None:
        lambdas = [0.0] + [top * (2 ** -k) for k in range(12, -1, -1)] if top else [0.0]
    best = 0.0
    for lam in sorted(lambdas):
        if lam < 0:
            raise ValueError(f"lambdas must be >= 0, got {lam!r}")
        total = -lam * exempt
        for plain, ex, points in per_trace:
            wins = list(plain) + [(t1, t2, _lagrange_weight(row, points, lam))
                                  for t1, t2, row in ex]
            total += _best_disjoint_weighted(wins)
        logger.debug("min_misses_tail: lambda %.4g gives %.3f", lam, total)
        best = max(best, total)
    return math.ceil(best - 1e-6)


def _best_disjoint_weighted(windows: list) -> float:
    """``bound._best_disjoint`` for real weights (non-positive ones never help)."""
    return _best_disjoint([w for w in windows if w[2] > 0])


# ---- co-present packing credit (``work="co-present"``, ``"co-present-proportional"``) -------

#: the co-present kinds (``TAIL_WORK_KINDS``) and the split each uses
CO_PRESENT_SPLITS = {"co-present": "equal", "co-present-proportional": "proportional"}


class _Infeasible(ValueError):
    """No schedule keeps the limits (with the works used: see the miss budget)."""


@dataclass(slots=True)
class UseWorks:
    """Per-request works (device s, in ``requests``' order) for the three cases in which the
    window arguments charge a request (``co_present_works``)."""

    on_time: list[float]
    tail: list[float]
    max: list[float]


def co_present_works(
    requests: Sequence[Request],
    cost: CostModel,
    work: str,
    max_flow: float,
    tail_flow: float,
    exempt: int,
    misses: int | None = None,
) -> UseWorks:
    """The co-present works of ``requests`` (one trace; device s per request, for the three
    cases in which the window arguments charge one): ``max_flow`` M (s, may be
    ``math.inf``), ``tail_flow`` T ≤ M (s), ``exempt`` e ≥ 0 flows allowed above T,
    ``misses`` m: the miss budget (None: none); ``work`` picks the split
    (``CO_PRESENT_SPLITS``).

    **Why.** ``"profile"`` and ``"proportional"`` charge every request as if each of its steps
    ran in the best full batch the trace's shapes allow, even when no partner is ever present
    beside it. Here a request is charged for the best step it can be in *with the requests that
    can be present at the same time*.

    **The rule.** A packed step holding requests i and j runs while both are in the system:
    inside [A_i, C_i] ∩ [A_j, C_j] (a request runs no step before it arrives or after it
    finishes). Let the schedules covered be those the tail bound speaks of — every flow
    ≤ M (``max_flow``), at most e (``exempt``, pooled over traces: at most e in each) flows
    > T (``tail_flow``), and, where a miss budget m is given, at most m deadline misses.
    In each of them, for every request j: C_j ≤ A_j + M ("loose end"), and C_j ≤ τ_j (the
    "tight end": A_j + T, or min(D_j, A_j + T) with the budget m) for all but at most
    x = e (+ m) requests — the exempt ones (flow above T) and the late ones. The window
    arguments charge request i's work in three cases only, each with its own work:

    * on time (a member of K counted as on time; Moore–Hodgson): C_i ≤ min(D_i, A_i + M);
    * i ∈ J_T \\ E (must be done by its tail limit): C_i ≤ A_i + T;
    * i ∈ J_M (must be done by its maximum): C_i ≤ A_i + M.

    In each case all of i's steps run inside I = [A_i, L] with L the case's end, so every
    partner j of every step of i is a same-model request whose [A_j, C_j] meets I: A_j ≤ L
    and C_j ≥ A_i. Hence j's loose interval [A_j, A_j + M] meets I, and unless j is one of
    the ≤ x requests beyond their tight ends, so does its tight interval [A_j, τ_j]. Per
    token count s, with t_s (l_s) the requests j ≠ i of that size whose tight (loose) interval
    meets I, a step of i holds at most t_s + min(x, l_s − t_s) partners of size s, at most
    x of them beyond the t_s (summed over sizes), and at most ``max_batch`` − 1 in all. Any
    step of i is one of those batches, so i's charge per step under a split is at least the
    least charge over them (enumerated exactly: ``bound.MAX_BATCHES`` at most), and at least
    the trace-wide bound of the same split (``bound.min_work``'s profile share for the equal
    split, ``bound.packed_step_ratio`` over the trace's sizes for the proportional one): the
    larger of two lower bounds on the same charge is one. Both splits charge each step's time
    exactly once over its members (``bound``'s module docstring), so the window arguments hold
    with these works — one split for the whole trace (mixing the two per request would not:
    the charges of a step could then add up to more than its time). Encode and decode are
    charged in full, as in ``bound.min_work``.

    **The miss budget.** The works with the budget m hold for every covered schedule with
    ≤ m misses, so such a schedule misses at least LB(m), the bound computed with them. A
    covered schedule with k misses therefore has k ≥ LB(k), and k ≥ LB(∞) (no budget: the
    tight end A_j + T, x = e). ``min_misses_tail`` returns the least m ≥ LB(∞) with
    LB(m) ≤ m (each m tried in turn: no monotonicity is assumed), every smaller count being
    impossible; a budget under which even the exemptions cannot keep the limits counts as
    impossible too (``_Infeasible``). From m ≥ ``max_batch`` − 1 − e on the works (capped at
    ``max_batch`` − 1 partners) and so LB(m) stay the same, so the scan stops there with
    max(m, LB(m)). With the same split, each work is never below its
    ``"profile"`` (``"proportional"``) counterpart.
    """
    if work not in CO_PRESENT_SPLITS:
        raise ValueError(f"work must be one of {tuple(CO_PRESENT_SPLITS)}, got {work!r}")
    if not 0 < tail_flow <= max_flow:
        raise ValueError(f"need 0 < tail_flow <= max_flow, got {tail_flow!r}, {max_flow!r}")
    if exempt < 0 or misses is not None and misses < 0:
        raise ValueError(f"exempt and misses must be >= 0, got {exempt!r}, {misses!r}")
    split = CO_PRESENT_SPLITS[work]
    base = trace_work(requests, cost, "profile" if split == "equal" else "proportional")
    extra = exempt + (misses or 0)
    groups: dict[tuple[str, int], list[Request]] = {}
    for r in requests:
        groups.setdefault((r.model, cost.tokens(r)), []).append(r)

    def tight_end(r: Request) -> float:
        end = r.arrival + tail_flow
        return end if misses is None else min(end, r.deadline)

    # per (model, size): sorted arrivals, tight ends and loose ends
    index = {key: (sorted(r.arrival for r in rs), sorted(tight_end(r) for r in rs),
                   sorted(r.arrival + max_flow for r in rs)) for key, rs in groups.items()}
    sizes_of: dict[str, list[int]] = {}
    for model, n in index:
        sizes_of.setdefault(model, []).append(n)
    memo: dict[tuple, float] = {}

    def charge(r: Request, end: float) -> float:
        """Least per-step charge of ``r`` (split's units: s for equal, a ratio for
        proportional) over the steps it can be in while its steps run in [A, end]."""
        n, mb = cost.tokens(r), cost.max_batch(r.model)
        caps = []
        for s in sorted(sizes_of[r.model]):
            arr, tight, loose = index[r.model, s]
            before = bisect.bisect_right(arr, end + 1e-9)
            t = before - bisect.bisect_left(tight, r.arrival - 1e-9)
            lo = before - bisect.bisect_left(loose, r.arrival - 1e-9)
            if s == n:  # r itself is in both counts
                t, lo = t - 1, lo - 1
            if lo > 0:
                caps.append((s, min(t, mb - 1), min(lo, mb - 1)))
        key = (r.model, n, tuple(caps), min(extra, mb - 1))
        if key not in memo:
            memo[key] = _least_charge(cost, r.model, n, caps, min(extra, mb - 1), split)
        return memo[key]

    def work_of(r: Request, end: float) -> float:
        n = cost.tokens(r)
        if split == "equal":
            share = charge(r, end)
        else:
            share = cost.step_time(r.model, [n]) * charge(r, end)
        own = cost.encode_time(r) + r.steps * share + cost.decode_time(r)
        return max(own, base(r))

    return UseWorks(
        on_time=[work_of(r, min(r.deadline, r.arrival + max_flow)) for r in requests],
        tail=[work_of(r, r.arrival + tail_flow) for r in requests],
        max=[work_of(r, r.arrival + max_flow) for r in requests],
    )


def _least_charge(cost: CostModel, model: str, tokens: int, caps: list, extra: int,
                  split: str) -> float:
    """min over the batches holding one member of ``tokens`` and partners within ``caps``
    ((size, tight count, loose count), each ≤ ``max_batch`` − 1) — per size at most
    t + min(extra, l − t), at most ``extra`` beyond the t's in all, at most ``max_batch`` − 1
    partners — of its charge: T(C) / |C| (``split="equal"``) or T(C) / Σ T({c})
    (``"proportional"``); alone counts (T({n}), resp. 1)."""
    alone = cost.step_time(model, [tokens])
    best = alone if split == "equal" else 1.0
    most = {s: t + min(extra, lo - t) for s, t, lo in caps}
    tight = {s: t for s, t, _ in caps}
    sizes = sorted(most)
    room = min(cost.max_batch(model) - 1, sum(most.values()))
    count = math.comb(len(sizes) + room, room)
    if count > MAX_BATCHES:
        raise ValueError(f"co_present_works: {count} batches of up to {room + 1} members over "
                         f"{len(sizes)} token counts (most {MAX_BATCHES})")
    solo = {s: cost.step_time(model, [s]) for s in sizes}
    for b in range(1, room + 1):
        for group in itertools.combinations_with_replacement(sizes, b):
            mult = {s: group.count(s) for s in set(group)}
            if any(k > most[s] for s, k in mult.items()):
                continue
            if sum(max(0, k - tight[s]) for s, k in mult.items()) > extra:
                continue
            t = cost.step_time(model, [tokens, *group])
            best = min(best, t / (b + 1) if split == "equal"
                       else t / (alone + sum(solo[s] for s in group)))
    return best
