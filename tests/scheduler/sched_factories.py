"""Factories for scheduler tests: small cost models with round numbers, requests, a fake
clock and a hand-driven engine view (no simulator involved)."""

from __future__ import annotations

import itertools

from ditmem.scheduler import (
    CostModel,
    Location,
    MemoryState,
    Request,
    RequestStatus,
    SchedulerView,
    WaitingQueue,
    make_policy,
)
from ditmem.scheduler.simulator import simulate

PAGE = 1 << 20


def _v(value, source="test"):
    return {"value": value, "source": source}


def table_profile(
    *,
    seconds_1024: float = 1.0,
    seconds_4096: float = 4.0,
    batch_points: list[dict] | None = None,
    max_batch: int = 4,
    encode_s: float = 0.0,
    decode_s_per_mp: float = 0.0,
    state_bytes: int = PAGE,
    device_bytes: float = 1e12,
    host_bytes: float = 1e12,
    link: float = 1e9,
) -> dict:
    """A measured-style profile: a 512² request (1,024 tokens) steps in ``seconds_1024``."""
    points = [
        {"tokens": 1024, "batch": 1, "seconds": seconds_1024},
        {"tokens": 4096, "batch": 1, "seconds": seconds_4096},
    ] + (batch_points or [])
    return {
        "format": 1,
        "name": "test-table",
        "device_bytes": _v(device_bytes),
        "host_bytes": _v(host_bytes),
        "host_link_bytes_per_s": _v(link),
        "models": {
            "qwen-image": {
                "weights_bytes": _v(0),
                "workspace_bytes": _v(0),
                "state_bytes_per_token": _v(0),
                "state_bytes_per_request": _v(state_bytes),
                "encode_s": _v(encode_s),
                "decode_s_per_megapixel": _v(decode_s_per_mp),
                "max_batch": _v(max_batch),
                "step": {"kind": "table", "points": _v(points)},
            }
        },
    }


def table_cost(**kw) -> CostModel:
    return CostModel.from_dict(table_profile(**kw))


def tiled_cost() -> CostModel:
    """``table_profile`` with tiled decodes: a 512² steps in 1 s and decodes as 4 tiles of
    0.5 s (256-px tiles)."""
    data = table_profile(decode_s_per_mp=1.0)
    data["models"]["qwen-image"].update(
        decode_tile_px={"value": 256, "source": "test"},
        decode_stride_px={"value": 256, "source": "test"},
        decode_tile_s={"value": 0.5, "source": "test"},
    )
    return CostModel.from_dict(data)


def req(
    rid: str,
    arrival: float = 0.0,
    *,
    size: int = 512,
    steps: int = 4,
    priority: int = 1,
    slo_ms: float | None = None,
    cost: CostModel | None = None,
    scale: float = 3.0,
    model: str = "qwen-image",
) -> Request:
    """A square image request; with ``cost`` its deadline is assigned."""
    r = Request(rid, arrival, model, size, size, 1, steps, priority, slo_ms)
    if cost is not None:
        cost.assign_deadline(r, scale)
    return r


def poisson_trace(rng, n: int, mean_gap: float, cost: CostModel, *, prefix: str,
                  max_steps: int = 6, priorities: bool = True) -> list[Request]:
    """``n`` requests, Poisson arrivals ``mean_gap`` s apart on average: 512² twice as often
    as 1024², 1 … ``max_steps`` steps, priority 0–2 (``priorities``; else 1), SLO 1.5 or 3
    × standalone; ids ``{prefix}-{i}``."""
    trace, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / mean_gap)
        size, steps = rng.choice((512, 512, 1024)), rng.randint(1, max_steps)
        priority = rng.choice((0, 1, 2)) if priorities else 1
        trace.append(req(f"{prefix}-{i}", t, size=size, steps=steps, priority=priority,
                         scale=rng.choice((1.5, 3.0)), cost=cost))
    return trace


class FakeClock:
    """A manual clock for driving a policy by hand."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class HandEngine:
    """A view builder: waiting queue, active statuses and page counts set by the test."""

    def __init__(self, cost: CostModel, total_pages: int = 1000, host_pages: int = 1000):
        self.cost = cost
        self.waiting = WaitingQueue()
        self.active: dict[str, RequestStatus] = {}
        self.total = total_pages
        self.host = host_pages
        self.last_batch: tuple[str, ...] = ()
        self.max_active: int | None = None

    def arrive(self, r: Request) -> Request:
        self.waiting.push(r)
        return r

    def start(self, r: Request, steps_done: int = 0, on_host: bool = False) -> RequestStatus:
        pages = self.cost.pages_for(r, PAGE)
        status = RequestStatus(
            r,
            steps_done,
            Location.HOST if on_host else Location.DEVICE,
            pages,
            started_at=r.arrival,
        )
        self.active[r.id] = status
        return status

    def view(self) -> SchedulerView:
        used = sum(s.pages for s in self.active.values() if s.location is Location.DEVICE)
        hosted = sum(s.pages for s in self.active.values() if s.location is Location.HOST)
        mem = MemoryState(self.total, self.total - used, PAGE, self.host - hosted)
        return SchedulerView(
            list(self.active.values()), self.waiting, mem, self.last_batch, self.max_active
        )


def edf_feasible(jobs) -> bool:
    """Preemptive EDF with release dates on one machine, the exact feasibility test a brute
    force builds on: ``jobs`` = (release, deadline, work) tuples; True when every job can
    finish by its deadline."""
    jobs = sorted(jobs)
    now, k, live = 0.0, 0, []
    while k < len(jobs) or live:
        if not live:
            now = max(now, jobs[k][0])
        while k < len(jobs) and jobs[k][0] <= now + 1e-12:
            live.append([jobs[k][1], jobs[k][2]])
            k += 1
        live.sort()
        nxt = jobs[k][0] if k < len(jobs) else float("inf")
        run = min(live[0][1], nxt - now)
        now += run
        live[0][1] -= run
        if live[0][1] <= 1e-12:
            if now > live[0][0] + 1e-9:
                return False
            live.pop(0)
    return True


def best_misses_joint(trace, work, max_flow, tail_flow, exempt):
    """Fewest misses over every schedule (preemptive, one machine, these works) with every
    flow <= max_flow and at most ``exempt`` flows > tail_flow: brute force over the late set
    and the exempt set; None when no schedule keeps the limits."""
    n = len(trace)
    exempt_sets = [set(c) for k in range(min(exempt, n) + 1)
                   for c in itertools.combinations(range(n), k)]
    for misses in range(n + 1):
        for late in itertools.combinations(range(n), misses):
            for ex in exempt_sets:
                jobs = []
                for i, r in enumerate(trace):
                    limit = r.arrival + (max_flow if i in ex else tail_flow)
                    jobs.append((r.arrival, limit if i in late else min(r.deadline, limit),
                                 work[i]))
                if edf_feasible(jobs):
                    return misses
    return None


class TwoSecondForecast:
    """A forecast stub for the give-up rule: 2 s of expected earlier-due arrivals within any
    window over 3 s, none within shorter ones; its arrivals' highest priority class is
    ``top`` (0: priority 0 arrives)."""

    latest = float("inf")

    def __init__(self, top: int = 0):
        self.top = top

    def top_priority(self):
        return self.top

    def see(self, requests):
        pass

    def work_before(self, delta, now, priority=2):
        return 2.0 if delta > 3.0 else 0.0


def forecast_trace_finish(a_priority: int = 1, top: int = 0, **options) -> dict[str, float]:
    """Session 11's give-up trace (steps of 1 s, one request a step, no batching): B (due
    1.5, 1 step) and A (due 6.5, 4 steps, priority ``a_priority``) at 0, C (due 2.5, 1 step)
    at 1, D (due 9, 2 steps) at 2, all others priority 1, under ``slo`` with ``options`` and a
    ``TwoSecondForecast(top)``; each id's finish (s)."""
    cost = table_cost()
    trace = [req("B", 0.0, steps=1, slo_ms=1_500, cost=cost),
             req("A", 0.0, steps=4, priority=a_priority, slo_ms=6_500, cost=cost),
             req("C", 1.0, steps=1, slo_ms=1_500, cost=cost),
             req("D", 2.0, steps=2, slo_ms=7_000, cost=cost)]
    pol = make_policy("slo", cost, batching=False, **options)
    pol.forecast = TwoSecondForecast(top)
    return {rec.request.id: rec.finished for rec in simulate(trace, pol, page_bytes=PAGE).records}


def tiles_only(policy):
    """``policy`` (slo) with its plans' ``first_decodes`` and ``hold_tiles`` emptied: every
    decode goes through the loop's decode lane, as before session 18 (and as a late decode
    outside the tail lane does). Returns ``policy``."""
    schedule = policy.schedule

    def plan(now, view):
        p = schedule(now, view)
        p.first_decodes, p.hold_tiles = (), False
        return p

    policy.schedule = plan
    return policy
