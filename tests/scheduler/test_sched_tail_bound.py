"""The tail bound of ``slo`` (``policies/late_lane``): a late request finishes by the second
deadline it was promised when it was given up, whatever arrives after it and however full
memory is; and the "late" label never flips back. Exact timings (no noise), a 512² step
costs 1 s and a 1024² step 4 s (``table_cost``)."""

import random

import pytest
from sched_factories import PAGE, req, table_cost

from ditmem.scheduler import make_policy
from ditmem.scheduler.simulator import simulate


class _Watch:
    """Wraps slo: after every decision, remembers the lane (ids and second deadlines)."""

    def __init__(self, inner):
        self.inner = inner
        self.promised: dict[str, float] = {}
        self.lanes: list[tuple[str, ...]] = []

    def schedule(self, now, view):
        plan = self.inner.schedule(now, view)
        lane = self.inner.lane
        for rid in lane.ids():
            due = lane.due(rid)
            assert self.promised.setdefault(rid, due) == due  # a promise never moves
        self.lanes.append(lane.ids())
        return plan

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _adversary(cost, n_small=300, gap=2.2):
    """One large low-priority request that cannot make its deadline (40 s of work, due in
    30 s), then a stream of small priority-0 requests (2 steps, due 8 s after arrival; load
    0.91 from the stream alone), each holding its own page."""
    large = req("L", 0.25, size=1024, steps=10, priority=2, slo_ms=30_000, cost=cost)
    stream = [req(f"u{i:03d}", 0.5 + gap * i, steps=2, priority=0, slo_ms=8_000, cost=cost)
              for i in range(n_small)]
    return [large, *stream]


@pytest.mark.parametrize("windows, share", [(0.5, 1.0), (1.0, 0.5), (3.0, 0.1)])
def test_a_large_late_request_meets_its_second_deadline_against_an_urgent_stream(
    windows, share
):
    cost = table_cost(link=1e15)  # transfers ~free: the bound is exact
    trace = _adversary(cost)
    policy = _Watch(make_policy("slo", cost, late_windows=windows, late_share=share,
                                forecast=False))
    # one device page: memory is full whenever anything is in
    res = simulate(trace, policy, page_bytes=PAGE, device_pages=1)
    rec = {r.request.id: r for r in res.records}
    assert "L" in policy.promised and not rec["L"].met
    large = rec["L"].request
    window = large.deadline - large.arrival
    # promised when given up (on arrival: no time spent yet) — by hand:
    assert policy.promised["L"] == pytest.approx(
        max(large.deadline + windows * window, large.arrival + 40.0 / share)
    )
    assert rec["L"].finished <= policy.promised["L"] + 1e-6  # + the ns transfers
    # so did every urgent request that the disruption made late in turn
    for rid, due in policy.promised.items():
        assert rec[rid].finished <= due + 1e-6, rid
    if share < 1:  # L waited with memory full: it was moved out, then made room for
        assert rec["L"].offloads >= 1


def test_without_the_lane_the_stream_pushes_the_large_request_past_that_bound():
    cost = table_cost(link=1e15)
    trace = _adversary(cost)
    # a promise so far away that it never binds: the previous rule (spare time only)
    res = simulate(trace, make_policy("slo", cost, late_windows=1e9, forecast=False),
                   page_bytes=PAGE, device_pages=1)
    large = next(r for r in res.records if r.request.id == "L")
    bound = large.request.deadline + 0.5 * (large.request.deadline - large.request.arrival)
    assert large.finished > bound + 50  # the adversary works: the test above can fail


def test_every_promise_holds_and_no_label_flips_on_random_traces():
    cost = table_cost(link=1e15, batch_points=[{"tokens": 1024, "batch": 2, "seconds": 1.5}])
    rng = random.Random(5)
    for trial in range(12):
        trace, t = [], 0.0
        for i in range(120):
            t += rng.expovariate(1 / 1.6)
            big = rng.random() < 0.15
            trace.append(req(f"t{trial}-{i:03d}", t, size=1024 if big else 512,
                             steps=rng.randint(2, 8), priority=rng.choice((0, 1, 2)),
                             scale=rng.choice((1.2, 2.0, 3.0)), cost=cost))
        windows, share = rng.choice(((0.5, 1.0), (1.0, 0.5), (2.0, 0.25)))
        policy = _Watch(make_policy("slo", cost, late_windows=windows, late_share=share))
        res = simulate(trace, policy, page_bytes=PAGE, device_pages=rng.choice((2, 4, 64)))
        finished = {r.request.id: r.finished for r in res.records}
        assert policy.promised, "the traces must overload enough to give some up"
        for rid, due in policy.promised.items():
            assert finished[rid] <= due + 1e-6, (trial, rid)
        # once in the lane, a request stays there until it finishes
        seen: set[str] = set()
        for lane in policy.lanes:
            members = set(lane)
            gone = seen - members
            assert all(finished[rid] <= res.makespan for rid in gone)
            seen |= members
