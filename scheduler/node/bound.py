"""The offline bound and the clairvoyant reference on a node of D devices.

**Relaxation (what makes the bound sound).** Any schedule on D devices does at most
D × (t2 − t1) device-seconds of work inside a window [t1, t2], and a request costs at least
its *least device-seconds*: over every degree d and every batch, d × its share of a step at
d is never below its share at degree 1 (speed-up(d) ≤ d, checked on the profile), so the
least is the single-device bound's work (``ditmem.scheduler.bound.min_work``, profile
shares: the per-step floor over a full batch, utilisation with the trace's largest
partners; encode and decode). So the node is relaxed to **one machine D times as fast**
(every request's work divided by D) and the single-device machinery applies unchanged —
Moore–Hodgson per window, disjoint windows summed. Separately, a request that cannot meet
its deadline even alone at the node's best degree (steps at the fastest degree, encode and
decode single-device, nothing queued before it) misses in every schedule; it is counted and
left out of the windows (which only loosens them).

The relaxation grants what no node has: work split across devices at no efficiency loss,
batching credit for every request, preemption at any instant and the future known. Noise:
the bound is on the profile's times; with timing noise on, true times scatter by a few
percent around them, so the bound is approximate to that order (the property test runs
noise-free).

**Latency floor and latency bound (P95).** A request's latency is at least its encode (one
device), its decode at its fastest (a decode split over k ≤ max(degrees) devices ends no
sooner than its slowest device's tiles, nor than its lane's tiles plus the blend:
``least_decode``), serial with its steps, and the sum of its step durations. (Until
session 23 the whole single-device decode was charged here, which `slo`'s split decodes
beat: a 1024² alone on two devices in 3.89 s against a "floor" of 5.40 s.) Its
device-seconds count every decode tile and the blend (``least_decode``).
A step of a packed batch lasts at least the request's own share of it (the shares add up to
the step), and its share at degree d is at least ``profile_step_share`` (the single-device
bound's least share, with any partners of the trace) ÷ the largest speed-up any batch
holding it can reach at d (``max_speedup``: over the token totals from its own to
``max_batch`` members of the trace's largest size). So ``least_latency`` is sound, and the
q-th percentile of the least latencies (``latency_floor``) bounds every schedule's q-th
percentile from below (latencies dominate floors one by one; the percentile is monotone in
each value). ``latency_bound`` adds the node's capacity: for a latency X, a request
finishing within X spends at least ``least_device_seconds(X)`` — the least d × duration
over its steps' degrees whose step durations fit X − encode − decode (a linear relaxation
over the fraction of steps at each degree: never above any integer choice), plus encode
and decode. Every request with latency ≤ X is a request meeting the deadline A + X with
that work, so the D-times-faster machine's window bound (above) on those deadlines and
works gives a least number m(X) of requests with latency > X in any schedule; when m(X)
reaches N − ⌊(N − 1) q / 100⌋ the q-th percentile (linear interpolation, as
``metrics.percentile``) exceeds X. The largest X found so certifies the bound. Both hold
for profile times; with timing noise on they are approximate to the noise's order (the
sum of a request's step draws scatters by about σ/√steps).

**The step rule (default, ``rule="step"``).** The share rule above lets a step last only the
request's own share; but a request's latency pays the whole step. ``StepFloors.step_points``
lists, per degree d and per batch B of the request and up to ``max_batch`` − 1 partners of
the trace's token counts, the step's true duration ``T(B) / speedup(Σ tokens, d)`` and the
request's *charge*: the step's d × duration split in proportion to the members' least
shares — the same split whichever member computes it, so the charges of one step add up to
its device-seconds. The least latency uses the shortest such step (for most shapes: alone
at the largest degree), and ``least_device_seconds`` the lower convex envelope of the
(duration, charge) points (a fractional choice of steps: never above any real one). Both
are never looser than the share rule (the whole step is at least one share; the charge at
least the share rule's d × share ÷ best speed-up). ``joint_latency_bound`` adds an
attainment floor: the least P95 of any schedule that also holds ≥ 99 % (its docstring).

**Clairvoyant reference.** ``clairvoyant_node_misses``: the single-device clairvoyant EDF
with give-up (``ditmem.scheduler.bound.clairvoyant_misses``) on the same D-times-faster
machine, with each request's standalone degree-1 time as its work — a schedule of the
relaxed machine, not of the node, so a reference point, not an achievable target.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

from ..bound import clairvoyant_misses, min_misses
from ..cost import CostModel
from ..metrics import percentile
from ..request import Request
from .cost import NodeCost

INF = float("inf")


class _PooledCost:
    """A CostModel view whose every duration is divided by ``devices`` (the relaxed machine);
    only what the single-device bound reads."""

    def __init__(self, cost: CostModel, devices: int):
        self._cost, self._d = cost, devices

    def tokens(self, request: Request) -> int:
        return self._cost.tokens(request)

    def encode_time(self, request: Request) -> float:
        return self._cost.encode_time(request) / self._d

    def decode_time(self, request: Request) -> float:
        return self._cost.decode_time(request) / self._d

    def profile_step_share(self, model: str, tokens: int, lo: int, hi: int) -> float:
        return self._cost.profile_step_share(model, tokens, lo, hi) / self._d

    def min_step_share(self, model: str, tokens: int) -> float:
        return self._cost.min_step_share(model, tokens) / self._d


def fastest_alone(request: Request, ncost: NodeCost, degrees: Sequence[int]) -> float:
    """Least seconds ``request`` can take from arrival to finish on the node: encode, its
    steps at the fastest degree, its decode at its fastest split (profile times)."""
    cost = ncost.cost
    tokens = cost.tokens(request)
    step = min(
        cost.step_time(request.model, [tokens]) / ncost.speedup(request.model, tokens, d)
        for d in degrees
    )
    return (cost.encode_time(request) + request.steps * step
            + least_decode(request, ncost, max(degrees))[0])


def check_speedups(ncost: NodeCost, requests: Sequence[Request], degrees: Sequence[int]) -> None:
    """The relaxation needs speed-up(d) ≤ d for every degree and shape of the trace."""
    for r in requests:
        n = ncost.cost.tokens(r)
        for d in degrees:
            if ncost.speedup(r.model, n, d) > d + 1e-9:
                raise ValueError(f"speed-up {ncost.speedup(r.model, n, d)} > degree {d}")


NODE_WORKS = ("profile", "deadline")


def min_node_misses(
    requests: Sequence[Request], ncost: NodeCost, devices: int, degrees: Sequence[int],
    *, work: str = "profile",
) -> int:
    """A lower bound on the misses of any schedule of ``requests`` on ``devices`` devices
    (module docstring). ``degrees``: the node's degrees. ``work="deadline"``: an on-time
    request's work is instead ``least_device_seconds`` at its own SLO window (step rule):
    it must finish within D − A, so its steps' charges are at least that (never below the
    profile work; tighter where the deadline forces a costly degree or a short batch)."""
    if work not in NODE_WORKS:
        raise ValueError(f"work must be one of {NODE_WORKS}, got {work!r}")
    if not requests:
        return 0
    check_speedups(ncost, requests, degrees)
    if work == "deadline":
        floors = StepFloors(requests, ncost, degrees)
        return _slow_count(requests, floors, devices, INF, "step", joint=True)
    hopeless = [r for r in requests if r.arrival + fastest_alone(r, ncost, degrees) > r.deadline]
    out = {r.id for r in hopeless}
    rest = [r for r in requests if r.id not in out]
    if not rest:
        return len(hopeless)
    return len(hopeless) + min_misses(rest, _PooledCost(ncost.cost, devices))


def clairvoyant_node_misses(requests: Sequence[Request], ncost: NodeCost, devices: int) -> int:
    """Misses of the clairvoyant EDF-with-give-up on the D-times-faster machine (module
    docstring), standalone degree-1 times as works."""
    if not requests:
        return 0
    scaled = [replace(r, standalone_s=r.standalone_s / devices) for r in requests]
    return clairvoyant_misses(scaled, ncost.cost, "standalone")


# ---- latency floor and latency bound (module docstring) ---------------------------------


def max_speedup(ncost: NodeCost, model: str, lo: int, hi: int, degree: int) -> float:
    """The largest speed-up at ``degree`` over step token totals in [lo, hi] (the table is
    piecewise linear in log(tokens): the ends and the knots between them suffice)."""
    if degree == 1:
        return 1.0
    knots = [math.exp(x) for x in ncost.parallel.table(model).log_tokens]
    points = [lo, hi] + [t for t in knots if lo < t < hi]
    return max(ncost.speedup(model, t, degree) for t in points)


#: Most batch compositions ``StepFloors.step_durations`` tries per request shape.
MAX_BATCHES = 20_000
#: How a step's least duration is bounded: "step" (the whole packed step, the default) or
#: "share" (the request's own share of it: the first version, looser).
LATENCY_RULES = ("step", "share")


def _batches(sizes: int, extra: int) -> int:
    """Multisets of at most ``extra`` partners drawn from ``sizes`` token counts."""
    return sum(math.comb(sizes + b - 1, b) for b in range(extra + 1)) if sizes else 1


class StepFloors:
    """Per request of a trace: the least share of one of its steps at each degree (s), the
    least duration of such a step (s), and its encode + decode (s). ``degrees``: the
    node's degrees."""

    def __init__(self, requests: Sequence[Request], ncost: NodeCost, degrees: Sequence[int]):
        check_speedups(ncost, requests, degrees)
        cost = ncost.cost
        self.degrees = tuple(degrees)
        span: dict[str, tuple[int, int]] = {}
        for r in requests:
            n = cost.tokens(r)
            lo, hi = span.get(r.model, (n, n))
            span[r.model] = (min(lo, n), max(hi, n))
        self._span = span
        sizes: dict[str, set[int]] = {}
        for r in requests:
            sizes.setdefault(r.model, set()).add(cost.tokens(r))
        self._sizes = {m: tuple(sorted(v)) for m, v in sizes.items()}
        self._cache: dict[tuple[str, int], tuple[float, ...]] = {}
        self._points: dict[tuple[str, int], list[tuple[float, float]] | None] = {}
        self._hulls: dict[tuple[str, int], list[tuple[float, float]]] = {}
        self._decodes: dict[tuple[str, int, int, int], tuple[float, float]] = {}
        self.ncost = ncost

    def durations(self, request: Request) -> tuple[float, ...]:
        """Least seconds of one step of ``request`` at each of ``degrees`` (any batch)."""
        cost = self.ncost.cost
        n = cost.tokens(request)
        key = (request.model, n)
        out = self._cache.get(key)
        if out is None:
            lo, hi = self._span[request.model]
            share = cost.profile_step_share(request.model, n, lo, hi)
            top = n + (cost.max_batch(request.model) - 1) * hi
            out = tuple(
                share / max_speedup(self.ncost, request.model, n, top, d) for d in self.degrees
            )
            self._cache[key] = out
        return out

    def step_points(self, request: Request) -> list[tuple[float, float]] | None:
        """(duration, charge) of one step holding ``request``, for every degree d and every
        batch B of it and up to ``max_batch`` − 1 partners of the trace's token counts (same
        model): the whole step lasts ``T(B) / speedup(Σ tokens, d)`` and occupies d devices;
        each member is charged that step's d × duration in proportion to its least share
        (``profile_step_share``), so the members' charges add up to the step's
        device-seconds exactly and each member's charge is the same whichever member's view
        it is computed from. None when there are more than ``MAX_BATCHES`` batches (then
        only the share rule applies)."""
        cost = self.ncost.cost
        n = cost.tokens(request)
        key = (request.model, n)
        if key in self._points:
            return self._points[key]
        sizes = self._sizes[request.model]
        extra = cost.max_batch(request.model) - 1
        out: list[tuple[float, float]] | None = None
        if _batches(len(sizes), extra) <= MAX_BATCHES:
            lo, hi = self._span[request.model]
            share = {m: cost.profile_step_share(request.model, m, lo, hi) for m in (n, *sizes)}
            out = []
            for b in range(extra + 1):
                for partners in itertools.combinations_with_replacement(sizes, b):
                    batch = [n, *partners]
                    t = cost.step_time(request.model, batch)
                    part = share[n] / sum(share[m] for m in batch)
                    for d in self.degrees:
                        dur = t / self.ncost.speedup(request.model, sum(batch), d)
                        out.append((dur, d * dur * part))
        self._points[key] = out
        return out

    def hull(self, request: Request) -> list[tuple[float, float]]:
        """``_lower_hull`` of ``step_points`` (cached per shape; needs the points)."""
        key = (request.model, self.ncost.cost.tokens(request))
        out = self._hulls.get(key)
        if out is None:
            pts = self.step_points(request)
            if pts is None:
                raise ValueError("too many batch compositions for the step rule")
            out = self._hulls[key] = _lower_hull(pts)
        return out

    def step_durations(self, request: Request) -> tuple[float, ...]:
        """Least seconds a step holding ``request`` lasts at each of ``degrees`` (the whole
        packed step, over ``step_points``' batches; ``durations`` when there are too many
        batches to try)."""
        pts = self.step_points(request)
        if pts is None:
            return self.durations(request)
        k = len(self.degrees)
        return tuple(min(p[0] for p in pts[i::k]) for i in range(k))

    def stage_latency(self, request: Request) -> float:
        """Least seconds of its encode + decode (serial with the steps): the encode on one
        device, the decode at its fastest over 1 … max(degrees) devices
        (``least_decode``: a split decode's tiles run side by side)."""
        return self.ncost.cost.encode_time(request) + self._decode(request)[0]

    def stage_work(self, request: Request) -> float:
        """Least device-seconds of its encode + decode: a split decode still runs every
        tile (its parts add up to the whole) and blends on its lane."""
        return self.ncost.cost.encode_time(request) + self._decode(request)[1]

    def _decode(self, request: Request) -> tuple[float, float]:
        """``least_decode`` of ``request``, cached per decode shape."""
        key = (request.model, request.width, request.height, request.frames)
        out = self._decodes.get(key)
        if out is None:
            out = self._decodes[key] = least_decode(request, self.ncost, max(self.degrees))
        return out


def least_decode(request: Request, ncost: NodeCost, most: int) -> tuple[float, float]:
    """(least seconds, least device-seconds) of ``request``'s decode over k = 1 … ``most``
    devices: a split decode (``NodeCost.decode_parts``) ends no sooner than its slowest
    device's tiles, nor than its lane's tiles plus the blend, and it runs every tile and
    the blend."""
    latency = work = INF
    for k in range(1, most + 1):
        parts, blend = ncost.decode_parts(request, k)
        latency = min(latency, max(max(parts), parts[0] + blend))
        work = min(work, sum(parts) + blend)
    return latency, work


def _lower_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The lower convex envelope of (duration, charge) points, by duration, cut at its
    least charge (longer durations never lower the least charge of a shorter budget)."""
    least: dict[float, float] = {}
    for x, y in points:
        least[x] = min(y, least.get(x, INF))
    pts = sorted(least.items())
    hull: list[tuple[float, float]] = []
    for p in pts:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) <= 0:
                hull.pop()
            else:
                break
        hull.append(p)
    k = min(range(len(hull)), key=lambda i: (hull[i][1], hull[i][0]))
    return hull[: k + 1]


def _hull_min(hull: list[tuple[float, float]], tau: float) -> float:
    """Least mean charge per step when the mean step duration is at most ``tau`` (inf when
    even the shortest step is longer)."""
    if tau < hull[0][0] - 1e-12:
        return INF
    if tau >= hull[-1][0]:
        return hull[-1][1]
    if tau <= hull[0][0]:  # within rounding of the shortest step
        return hull[0][1]
    k = bisect.bisect_right([p[0] for p in hull], tau)
    (x1, y1), (x2, y2) = hull[k - 1], hull[k]
    return y1 + (y2 - y1) * (tau - x1) / (x2 - x1)


def _check_rule(rule: str) -> None:
    if rule not in LATENCY_RULES:
        raise ValueError(f"rule must be one of {LATENCY_RULES}, got {rule!r}")


def _step_floor(request: Request, floors: StepFloors, rule: str) -> tuple[float, ...]:
    _check_rule(rule)
    if rule == "share":
        return floors.durations(request)
    return floors.step_durations(request)


def least_latency(request: Request, floors: StepFloors, *, rule: str = "step") -> float:
    """Least seconds from arrival to finish in any schedule: encode + decode + its steps at
    their shortest duration (module docstring; ``rule`` in ``LATENCY_RULES``)."""
    return floors.stage_latency(request) + request.steps * min(_step_floor(request, floors, rule))


def least_device_seconds(request: Request, floors: StepFloors, latency: float, *,
                         rule: str = "step") -> float:
    """Least device-seconds ``request`` spends in any schedule that finishes it within
    ``latency`` seconds of its arrival (inf when none can): encode + decode + the least
    total charge of its steps whose durations fit (linear relaxation over the fraction of
    steps at each point: its value is the lower convex envelope of the points).

    ``rule="step"``: the points are ``StepFloors.step_points`` — every real step of the
    request (a degree and a batch) is one of them, with its true duration and the charge
    that splits the step's device-seconds among its members, so any real schedule maps to
    a feasible choice with the same total (the members' charges add up to the device time
    used). ``rule="share"`` (the first version): per degree d, (d × its least share ÷ the
    best speed-up, as duration, and d × that as charge) — looser: a step never lasts only
    the request's own share."""
    _check_rule(rule)
    stages = floors.stage_work(request)
    budget = latency - floors.stage_latency(request)
    steps = request.steps
    if rule == "step" and floors.step_points(request) is not None:
        return stages + steps * _hull_min(floors.hull(request), budget / steps)
    tau = floors.durations(request)
    pts = [(t, d * t) for d, t in zip(floors.degrees, tau, strict=True)]
    best = INF
    for t, e in pts:
        if steps * t <= budget + 1e-12:
            best = min(best, steps * e)
    for ta, ea in pts:  # a slow degree a mixed with a fast degree b, filling the budget
        for tb, eb in pts:
            if ta <= tb or not steps * tb <= budget < steps * ta:
                continue
            xa = (budget - steps * tb) / (ta - tb)
            best = min(best, xa * ea + (steps - xa) * eb)
    return stages + best


def latency_floor(requests: Sequence[Request], ncost: NodeCost, degrees: Sequence[int],
                  q: float = 95.0, *, rule: str = "step") -> float:
    """The ``q``-th percentile of the requests' least latencies: no schedule's ``q``-th
    percentile of latency is lower (module docstring)."""
    floors = StepFloors(requests, ncost, degrees)
    return percentile([least_latency(r, floors, rule=rule) for r in requests], q)


class _WorkView:
    """What ``min_misses`` reads of a CostModel, for one-step surrogate requests whose works
    are given: ``tokens`` is the surrogate's index into ``works``; encode and decode are 0
    (already in the works)."""

    def __init__(self, works: dict[str, float]):
        self._index = {rid: i + 1 for i, rid in enumerate(works)}
        self._works = [0.0] + list(works.values())

    def tokens(self, request: Request) -> int:
        return self._index[request.id]

    def encode_time(self, request: Request) -> float:
        return 0.0

    def decode_time(self, request: Request) -> float:
        return 0.0

    def profile_step_share(self, model: str, tokens: int, lo: int, hi: int) -> float:
        return self._works[tokens]


def _slow_count(requests: Sequence[Request], floors: StepFloors, devices: int,
                latency: float, rule: str = "step", joint: bool = False) -> int:
    """Least number of ``requests`` with latency > ``latency`` in any schedule on
    ``devices`` devices (module docstring). ``joint``: least number that finish after
    min(deadline, arrival + ``latency``) instead (``joint_latency_bound``)."""
    works, surrogates, hopeless = {}, [], 0
    for r in requests:
        limit = min(latency, r.deadline - r.arrival) if joint else latency
        w = least_device_seconds(r, floors, limit, rule=rule)
        if w == INF:
            hopeless += 1
            continue
        works[r.id] = w / devices
        surrogates.append(replace(r, steps=1, deadline=r.arrival + limit))
    if not surrogates:
        return hopeless
    return hopeless + min_misses(surrogates, _WorkView(works))


def latency_bound(
    traces: Sequence[Sequence[Request]],
    ncost: NodeCost,
    devices: int,
    degrees: Sequence[int],
    q: float = 95.0,
    *,
    tol: float = 0.05,
    rule: str = "step",
) -> float:
    """A lower bound on the ``q``-th percentile of latency over the pooled requests of
    ``traces`` (independent runs, e.g. seeds) in any schedule on ``devices`` devices: the
    largest latency X found (bisection to ``tol`` s, from the pooled ``latency_floor``) at
    which the capacity argument of the module docstring certifies that more than the
    percentile's share of requests must take longer than X. ``rule``: ``LATENCY_RULES``."""
    return _bisect_latency(traces, ncost, devices, degrees, q, tol, rule, None)


def joint_latency_bound(
    traces: Sequence[Sequence[Request]],
    ncost: NodeCost,
    devices: int,
    degrees: Sequence[int],
    q: float = 95.0,
    attainment: float = 0.99,
    *,
    tol: float = 0.05,
    rule: str = "step",
) -> float:
    """A lower bound on the ``q``-th percentile of latency (pooled over ``traces``) of any
    schedule on ``devices`` devices whose pooled SLO attainment is ≥ ``attainment``; inf
    when the node bound forbids that attainment outright.

    Derivation: such a schedule has at most ``allowed = ⌊N (1 − attainment)⌋`` misses and,
    with its percentile ≤ X, at most ``need − 1`` requests slower than X (``need`` as in
    ``latency_bound``). A request finishing after min(deadline, arrival + X) is one or the
    other, so at most ``need − 1 + allowed`` do. The capacity argument of the module
    docstring with per-request limits min(D − A, X) (works ``least_device_seconds`` at
    that limit) gives a least number of such requests; where it reaches
    ``need + allowed``, every such schedule's percentile exceeds X. The count never rises
    with X (later limits, less work), so bisection finds the largest certified X. The plain
    certificate (``latency_bound``) is checked too, so this is never below it."""
    if not 0.0 <= attainment <= 1.0:
        raise ValueError(f"attainment must be in [0, 1], got {attainment!r}")
    return _bisect_latency(traces, ncost, devices, degrees, q, tol, rule, attainment)


def _bisect_latency(traces, ncost, devices, degrees, q, tol, rule, attainment) -> float:
    _check_rule(rule)
    traces = [list(t) for t in traces if t]
    if not traces:
        raise ValueError("latency_bound needs at least one non-empty trace")
    floors = [StepFloors(t, ncost, degrees) for t in traces]
    pooled = [least_latency(r, f, rule=rule)
              for t, f in zip(traces, floors, strict=True) for r in t]
    n = len(pooled)
    need = n - math.floor((n - 1) * q / 100.0)
    lo = percentile(pooled, q)
    joint = attainment is not None
    if joint:
        allowed = math.floor(n * (1.0 - attainment) + 1e-9)
        forced = sum(min_node_misses(t, ncost, devices, degrees) for t in traces)
        if forced > allowed:
            return INF
        need += allowed

    def certified(x: float) -> bool:
        def slow(joint_count: bool) -> int:
            pairs = zip(traces, floors, strict=True)
            return sum(_slow_count(t, f, devices, x, rule, joint_count) for t, f in pairs)

        if not joint:
            return slow(False) >= need
        # the plain certificate holds for these schedules too (they are a subset)
        return slow(False) >= need - allowed or slow(True) >= need

    hi = max(r.deadline - r.arrival for t in traces for r in t)
    if certified(hi):
        return hi
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if certified(mid) else (lo, mid)
    return lo
