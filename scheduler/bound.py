"""An offline bound: the fewest deadline misses *any* schedule must have on a trace.

For a time window [t1, t2], the requests that arrive at or after t1 and are due by t2 need
their work done inside it. Relaxing their arrivals to t1 leaves one machine with deadlines,
where Moore–Hodgson's rule (take them by deadline; whenever the work so far overruns the
current deadline, drop the largest) gives the exact fewest misses — so every schedule,
clairvoyant ones included, misses at least that many of them; the mirror image (deadlines
relaxed to t2, arrivals kept) is counted as well. Windows that do not overlap in
time cannot share device time, so their counts add up: the best set of disjoint windows
(weighted interval scheduling) gives a lower bound on misses, and hence an upper bound on
SLO attainment. (``windows="single"`` checks only each window's last deadline, the weaker
rule of the first version, kept for comparison.)

A request's *work* must be a lower bound on the device time it takes, with any batching:

* ``work="profile"`` (default): the least the simulated device can charge — per step, the
  lowest share of a packed step the cost model allows (``CostModel.profile_step_share``:
  its per-step floor split over a full batch, utilisation with the largest partners of the
  trace), plus encode and decode, which run serially;
* ``work="flops"``: device physics only — its FLOPs at full utilisation, no per-step floor
  (valid for any device of that peak rate; looser);
* ``work="proportional"`` (``trace_work``, ``min_misses``; not ``min_work``): each packed
  step's time split among its members in proportion to their batch-1 step times
  (``packed_step_ratio``) — much tighter where unequal sizes share a step.

**The proportional split.** Let T(C) be the cost model's time for one step of a packed batch
C (a multiset of token counts, ``CostModel.step_time``) and a(n) = T({n}) > 0 a step alone.
Charge each member m of a batch C the part T(C) · a(m) / Σ_{c∈C} a(c) of its step: the parts
add up to T(C) exactly. A member of n tokens is thus charged at least a(n) · ρ(n), with
ρ(n) = min(1, min_C T(C) / Σ_{c∈C} a(c)) over every batch C the engine may run that holds it
— n and up to ``max_batch`` − 1 partners, each of a token count of the trace (one model per
trace). The device runs one thing at a time (encodes, steps, decodes — inline, tile by tile
or on the concurrent decode worker, which shares the same device; host transfers and chunk
overheads only add time), so over any span of time the device is busy at least the sum of
the charges of the steps run in it plus the encodes and decodes run in it. An on-time
request of a window runs its encode, all its steps and its decode inside the window, so
``encode + steps · a(n) · ρ(n) + decode`` of the window's time is its own: the window
argument above holds with this work. Unlike the profile share (``CostModel.
profile_step_share``, which splits a batch equally, so a large request next to small ones
is charged a fraction of a step it waits for in full), this rule never credits a request
more than the step it is in actually saves against running its members alone. A step model
may be any function of the batch (no convexity or monotonicity is assumed): ρ is found by
enumerating the batches (``MAX_BATCHES`` at most).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Callable, Sequence

from .cost import CostModel
from .request import Request

WORK_KINDS = ("profile", "flops")
#: ``trace_work``'s (and so ``min_misses``'): ``WORK_KINDS`` and the proportional split
TRACE_WORK_KINDS = (*WORK_KINDS, "proportional")
#: the most batches ``packed_step_ratio`` enumerates for one request shape
MAX_BATCHES = 200_000
WINDOW_RULES = ("moore-hodgson", "single")


def min_work(
    request: Request,
    cost: CostModel,
    work: str = "profile",
    partners: tuple[int, int] | None = None,
) -> float:
    """The least device seconds ``request`` can cost: encode + decode + its steps at the
    least share of a step (``work``, see the module docstring). ``partners`` = (fewest, most)
    tokens a batch partner can have (default: the request's own, i.e. same-shape batches)."""
    tokens = cost.tokens(request)
    if work == "profile":
        lo, hi = partners if partners is not None else (tokens, tokens)
        share = cost.profile_step_share(request.model, tokens, lo, hi)
    elif work == "flops":
        share = cost.min_step_share(request.model, tokens)
    else:
        raise ValueError(f"work must be one of {WORK_KINDS}, got {work!r}")
    return cost.encode_time(request) + request.steps * share + cost.decode_time(request)


def packed_step_ratio(
    cost: CostModel, model: str, tokens: int, partner_tokens: Sequence[int]
) -> float:
    """ρ(n) of the module docstring: the least T(C) / Σ_{c∈C} T({c}) over the batches C of
    ``model`` holding one member of ``tokens`` and up to ``max_batch`` − 1 partners whose
    token counts are among ``partner_tokens``, and 1 (alone). Any schedule charges a member
    of ``tokens`` at least ρ × its batch-1 step time for each step under the proportional
    split. ValueError when there would be more than ``MAX_BATCHES`` batches to try."""
    sizes = sorted(set(partner_tokens))
    partners = cost.max_batch(model) - 1
    count = math.comb(len(sizes) + partners, partners)
    if count > MAX_BATCHES:
        raise ValueError(
            f"packed_step_ratio: {count} batches of up to {partners + 1} members over "
            f"{len(sizes)} token counts (most {MAX_BATCHES}); give fewer partner_tokens"
        )
    alone = {n: cost.step_time(model, [n]) for n in [*sizes, tokens]}
    best = 1.0
    for b in range(1, partners + 1):
        for group in itertools.combinations_with_replacement(sizes, b):
            batch = [tokens, *group]
            best = min(best, cost.step_time(model, batch) / sum(alone[n] for n in batch))
    return best


def trace_work(
    requests: Sequence[Request], cost: CostModel, work: str = "profile"
) -> Callable[[Request], float]:
    """``min_work`` for requests of this trace (partners: any same-model request of it);
    ``work="proportional"``: encode + steps × batch-1 step × ``packed_step_ratio`` with the
    trace's token counts as partners + decode (module docstring)."""
    if work == "proportional":
        return _proportional_work(requests, cost)
    span: dict[str, tuple[int, int]] = {}
    for r in requests:
        n = cost.tokens(r)
        lo, hi = span.get(r.model, (n, n))
        span[r.model] = (min(lo, n), max(hi, n))
    return lambda r: min_work(r, cost, work, span[r.model])


def _proportional_work(
    requests: Sequence[Request], cost: CostModel
) -> Callable[[Request], float]:
    sizes: dict[str, set[int]] = {}
    for r in requests:
        sizes.setdefault(r.model, set()).add(cost.tokens(r))
    ratio = {(m, n): packed_step_ratio(cost, m, n, sorted(ns)) for m, ns in sizes.items()
             for n in ns}

    def work_of(r: Request) -> float:
        n = cost.tokens(r)
        step = cost.step_time(r.model, [n]) * ratio[r.model, n]
        return cost.encode_time(r) + r.steps * step + cost.decode_time(r)

    return work_of


def min_misses(
    requests: Sequence[Request],
    cost: CostModel,
    horizon: float | None = None,
    *,
    work: str = "profile",
    windows: str = "moore-hodgson",
) -> int:
    """A lower bound on the number of requests that miss their deadline under any policy.

    ``horizon`` caps window length (s); default 16× the longest SLO window. ``work`` and
    ``windows`` choose the per-request work and the per-window rule (module docstring).
    """
    if windows not in WINDOW_RULES:
        raise ValueError(f"windows must be one of {WINDOW_RULES}, got {windows!r}")
    if work not in TRACE_WORK_KINDS:
        raise ValueError(f"work must be one of {TRACE_WORK_KINDS}, got {work!r}")
    if not requests:
        return 0
    cost_of = trace_work(requests, cost, work)
    jobs = sorted(((r.arrival, r.deadline, cost_of(r)) for r in requests), key=lambda j: j[0])
    if horizon is None:
        horizon = 16 * max(d - a for a, d, _ in jobs)
    if windows == "single":
        return _best_disjoint(_windows(jobs, horizon, _single_deadline))
    return _best_disjoint(moore_hodgson_windows(jobs, horizon))


def min_misses_packed(
    requests: Sequence[Request], cost: CostModel, horizon: float | None = None
) -> int:
    """The larger of ``min_misses`` with the equal split (``work="profile"``) and with the
    proportional split (``work="proportional"``): both bound every schedule, packed or not,
    so the larger does too (neither rule is tighter on every profile: the proportional one on
    measured tables, where the equal split credits a large member a fraction of a step it
    waits for in full; the equal one on FLOPs profiles)."""
    return max(min_misses(requests, cost, horizon, work=w) for w in ("profile", "proportional"))


def moore_hodgson_windows(jobs: list, horizon: float) -> list[tuple[float, float, int]]:
    """Windows ``(t1, t2, misses)`` with Moore–Hodgson's count, arrivals relaxed to t1, and
    their mirror image (time reversed: deadlines relaxed to t2, arrivals kept); ``jobs`` =
    (arrival, deadline, work) by arrival."""
    found = _windows(jobs, horizon, _moore_hodgson)
    mirror = sorted(((-d, -a, p) for a, d, p in jobs), key=lambda j: j[0])
    return found + [(-t2, -t1, n) for t1, t2, n in _windows(mirror, horizon, _moore_hodgson)]


def _windows(jobs: list, horizon: float, count) -> list[tuple[float, float, int]]:
    """``count`` over each window [t1, t1 + horizon] starting at an arrival (jobs by arrival)."""
    found: list[tuple[float, float, int]] = []
    for i, (t1, _, _) in enumerate(jobs):
        inside = []
        for j in jobs[i:]:
            if j[0] > t1 + horizon:
                break
            if j[1] <= t1 + horizon:
                inside.append(j)
        inside.sort(key=lambda j: j[1])
        found += count(t1, inside)
    return found


def _moore_hodgson(t1: float, inside: list) -> list[tuple[float, float, int]]:
    """Windows [t1, t2] where the fewest misses (arrivals relaxed to t1) rise, with counts."""
    out: list[tuple[float, float, int]] = []
    kept: list[float] = []  # max-heap of kept works (negated)
    total, drops = 0.0, 0
    for _, t2, p in inside:
        heapq.heappush(kept, -p)
        total += p
        if total - (t2 - t1) > 1e-9:
            total += heapq.heappop(kept)
            drops += 1
            out.append((t1, t2, drops))
    return out


def _single_deadline(t1: float, inside: list) -> list[tuple[float, float, int]]:
    """Windows [t1, t2] with the misses needed to fit only the total work by t2."""
    out: list[tuple[float, float, int]] = []
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
            out.append((t1, t2, drops))
    return out


def _best_disjoint(windows: list[tuple[float, float, int]]) -> int:
    """Max total weight of windows whose time spans do not overlap (classic DP)."""
    windows.sort(key=lambda w: w[1])
    ends = [w[1] for w in windows]
    best = [0] * (len(windows) + 1)
    for k, (t1, _, w) in enumerate(windows):
        prev = bisect.bisect_right(ends, t1, 0, k)
        best[k + 1] = max(best[k], best[prev] + w)
    return best[-1]


def clairvoyant_misses(
    requests: Sequence[Request], cost: CostModel, work: str = "standalone"
) -> int:
    """Misses of an offline schedule that knows every arrival in advance (not optimal in
    general; a reference point between the online policies and ``min_misses``).

    Preemptive earliest-deadline-first on one device over each request's ``work``:
    ``"standalone"`` (batch-1 time: a schedule the device could run, up to preemption inside
    a step) or ``"profile"``/``"flops"`` (``min_work``: the relaxation ``min_misses``
    bounds, so equal counts prove the bound exact for it). When a request would miss, the
    largest-work request of that busy period due no later than it is set aside (it runs in
    leftover time and counts as a miss) and the schedule is redone; at the end each
    set-aside request, smallest first, is taken back if the schedule stays feasible.
    """
    return len(_clairvoyant_plan(requests, cost, work)[1])


def clairvoyant_flows(
    requests: Sequence[Request], cost: CostModel, work: str = "standalone"
) -> list[float]:
    """Flow times (finish − arrival, s, in ``requests``' order) in ``clairvoyant_misses``'
    schedule, made whole: the kept requests by preemptive EDF (each meets its deadline), the
    set-aside ones, oldest first, in the time the kept ones leave (preempted whenever a kept
    one is ready, so they never delay one). With ``work="standalone"`` it is a schedule the
    device can run one request per step, up to preemption inside a step: a flow list it
    shows reachable (e.g. its P99 against a tail target)."""
    jobs, removed = _clairvoyant_plan(requests, cost, work)
    heap: list[tuple] = []
    now, k = 0.0, 0
    rem: dict[int, float] = {}
    finish: dict[int, float] = {}
    while k < len(jobs) or heap:
        if not heap:
            now = max(now, jobs[k][0])
        while k < len(jobs) and jobs[k][0] <= now:
            a, d, p, i = jobs[k]
            rem[i] = p
            heapq.heappush(heap, (1, a, 0.0, i) if i in removed else (0, d, a, i))
            k += 1
        i = heap[0][3]
        run = min(rem[i], (jobs[k][0] if k < len(jobs) else math.inf) - now)
        now += run
        rem[i] -= run
        if rem[i] <= 1e-12:
            heapq.heappop(heap)
            finish[i] = now
    return [finish[i] - r.arrival for i, r in enumerate(requests)]


def _clairvoyant_plan(
    requests: Sequence[Request], cost: CostModel, work: str
) -> tuple[list[tuple[float, float, float, int]], set[int]]:
    """``clairvoyant_misses``' jobs (arrival, deadline, work, index), by arrival, and the
    indices it sets aside."""
    work_of = _standalone if work == "standalone" else trace_work(requests, cost, work)
    jobs = sorted(
        ((r.arrival, r.deadline, work_of(r), i) for i, r in enumerate(requests)),
        key=lambda j: (j[0], j[1]),
    )
    removed: set[int] = set()
    while (miss := edf_first_miss([j for j in jobs if j[3] not in removed])) is not None:
        busy_start, due = miss
        pool = [j for j in jobs if j[3] not in removed and j[0] >= busy_start and j[1] <= due]
        removed.add(max(pool, key=lambda j: (j[2], j[0]))[3])
    for j in sorted((j for j in jobs if j[3] in removed), key=lambda j: j[2]):
        removed.discard(j[3])
        if edf_first_miss([k for k in jobs if k[3] not in removed]) is not None:
            removed.add(j[3])
    return jobs, removed


def _standalone(request: Request) -> float:
    return request.standalone_s


def edf_first_miss(jobs: list[tuple[float, float, float, int]]) -> tuple[float, float] | None:
    """Run preemptive EDF on one device over ``jobs`` — (arrival s, deadline s, work s, id),
    sorted by arrival; return (start of the busy period, deadline) of the first miss, None
    when every deadline is met."""
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
