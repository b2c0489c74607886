"""The offline bound with a tail constraint (``scheduler/tail_bound``): never above the best
schedule found by brute force on tiny traces (every on-time subset, preemptive EDF on the
deadlines it implies), never beaten by fifo, tighter than the plain bound where FIFO's
worst busy period leaves no room, and a clear error for an impossible ``max_flow``."""

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_factories import req, table_cost

from ditmem.scheduler import make_policy
from ditmem.scheduler.bound import min_misses
from ditmem.scheduler.simulator import simulate
from ditmem.scheduler.tail_bound import min_misses_within


def _edf_feasible(jobs):
    """Preemptive EDF with release dates on one machine (optimal for feasibility):
    ``jobs`` = (release, deadline, work)."""
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


def _best_misses(trace, work, max_flow):
    """Fewest misses over every schedule with flows <= max_flow (brute force over the
    on-time set; a request on time must meet min(deadline, arrival + max_flow), one late
    only arrival + max_flow); None when no schedule keeps the flows."""
    n = len(trace)
    for misses in range(n + 1):
        for late in itertools.combinations(range(n), misses):
            jobs = [(r.arrival,
                     r.arrival + max_flow if i in late else min(r.deadline, r.arrival + max_flow),
                     work[i]) for i, r in enumerate(trace)]
            if _edf_feasible(jobs):
                return misses
    return None


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 12), st.integers(1, 5), st.sampled_from((1.2, 2.0, 3.0))),
                min_size=1, max_size=6),
       st.floats(3.0, 20.0))
def test_the_bound_is_never_above_the_brute_force_optimum(jobs, max_flow):
    cost = table_cost()  # no batching: a request's least work is its standalone time
    trace = [req(f"r{i}", a, steps=s, scale=scale, cost=cost)
             for i, (a, s, scale) in enumerate(sorted(jobs))]
    work = [cost.standalone_time(r) for r in trace]
    best = _best_misses(trace, work, max_flow)
    if best is None:  # infeasible: the bound must say so, or at least not exceed n
        try:
            assert min_misses_within(trace, cost, max_flow) <= len(trace)
        except ValueError as exc:
            assert "max_flow" in str(exc)
        return
    bound = min_misses_within(trace, cost, max_flow)
    assert bound <= best
    assert bound >= min_misses(trace, cost)  # never weaker than the plain bound


def test_fifo_busy_period_leaves_no_room_by_hand():
    """A 10-s request at 0, then 1-s requests due 2 s after arrival at 1, 2, ..., 9: FIFO
    finishes the big one at 10 (max flow 10, the small ones wait behind it). With every flow
    within 10 s, the big one takes all of [0, 10]: every small one due by 10 misses —
    8 of them (due 3 ... 10); the plain bound gives up only the big one."""
    cost = table_cost()
    big = req("big", 0.0, steps=10, slo_ms=10_500, cost=cost)  # due at 10.5
    small = [req(f"s{i}", float(i), steps=1, slo_ms=2_000, cost=cost) for i in range(1, 10)]
    trace = [big, *small]
    res = simulate(trace, make_policy("fifo", cost))
    flows = [r.finished - r.request.arrival for r in res.records]
    assert max(flows) == pytest.approx(10.0)
    assert min_misses(trace, cost) == 1
    assert min_misses_within(trace, cost, 10.0) == 8
    # within 11 s: the big one still takes 10 of the 11 s of [0, 11], where the nine small
    # ones are due: 8 miss; with a loose allowance the tail constraint adds nothing
    assert min_misses_within(trace, cost, 11.0) == 8
    assert min_misses_within(trace, cost, 30.0) == 1


def test_no_policy_that_keeps_fifos_max_beats_the_bound():
    cost = table_cost(encode_s=0.05, decode_s_per_mp=0.2)
    rng = random.Random(11)
    for trial in range(6):
        trace, t = [], 0.0
        for i in range(60):
            t += rng.expovariate(1 / 1.7)
            trace.append(req(f"t{trial}-{i}", t, size=rng.choice((512, 512, 1024)),
                             steps=rng.randint(1, 6), priority=rng.choice((0, 1, 2)),
                             scale=rng.choice((1.5, 3.0)), cost=cost))
        fifo = simulate(trace, make_policy("fifo", cost))
        worst = max(r.finished - r.request.arrival for r in fifo.records)
        bound = min_misses_within(trace, cost, worst)
        assert sum(not r.met for r in fifo.records) >= bound
        for name in ("slo", "srtf"):
            res = simulate(trace, make_policy(name, cost))
            if max(r.finished - r.request.arrival for r in res.records) <= worst + 1e-9:
                assert sum(not r.met for r in res.records) >= bound, (trial, name)


def test_bad_max_flow_is_refused():
    cost = table_cost()
    trace = [req("a", 0.0, steps=4, cost=cost), req("b", 0.5, steps=4, cost=cost)]
    with pytest.raises(ValueError, match="max_flow"):
        min_misses_within(trace, cost, 3.0)  # a 4-s request cannot finish within 3 s
    with pytest.raises(ValueError, match="max_flow"):
        min_misses_within(trace, cost, {"a": 10.0})
    with pytest.raises(ValueError, match="max_flow"):
        min_misses_within(trace, cost, 0.0)
