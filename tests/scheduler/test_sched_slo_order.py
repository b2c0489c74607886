"""``slo``'s serving order (``order``): earliest deadline, or earliest arrival under the EDF
guard — hand-computed schedules (1 s per step, no encode or decode, one request per step;
the guard's margin set to 0 unless a test says otherwise)."""

import pytest
from sched_factories import PAGE, req, table_cost

from ditmem.scheduler import make_policy
from ditmem.scheduler.simulator import simulate


def finish_times(result):
    return {rec.request.id: rec.finished for rec in result.records}


def run(policy, reqs, cost, **kw):
    opts = {"forecast": False, "batching": False, **kw} if policy == "slo" else kw
    return simulate(reqs, make_policy(policy, cost, **opts), page_bytes=PAGE)


def test_fifo_order_keeps_every_deadline_with_a_smaller_max_flow_than_edf():
    """A (4 steps, due at 20) starts at 0; B (2 steps, due at 11) arrives at 1. EDF runs B
    at once: B 1-3, A 3-6 (flows 6 and 2, max 6). FIFO-first keeps A running while B's slack
    (11 − 1 − 2 = 8 s) covers A's steps: A 0-4, B 4-6 (flows 4 and 5, max 5), both on time."""
    cost = table_cost()

    def trace():
        return [req("A", 0.0, steps=4, slo_ms=20_000, cost=cost),
                req("B", 1.0, steps=2, slo_ms=10_000, cost=cost)]

    edf = run("slo", trace(), cost, order="edf")
    assert finish_times(edf) == {"A": 6.0, "B": 3.0}
    fifo_first = run("slo", trace(), cost, order="fifo", order_margin=0.0)
    assert finish_times(fifo_first) == {"A": 4.0, "B": 6.0}
    assert all(r.met for r in fifo_first.records) and all(r.met for r in edf.records)
    assert max(r.latency for r in fifo_first.records) == 5.0
    assert max(r.latency for r in edf.records) == 6.0


def test_the_guard_falls_back_to_edf_to_save_a_deadline():
    """A (6 steps, due at 30) starts at 0; B (2 steps, due at 5) arrives at 1. B's slack is
    2 s at 1, 1 s at 2 (each covers one step of A), 0 at 3: the guard then runs B (EDF),
    3-5, on time to the second; A ends at 8. Plain FIFO finishes B at 8, 3 s late. With a
    margin of 0.25 of B's 4 s window (1 s) the guard already falls back at 2: B 2-4."""
    cost = table_cost()

    def trace():
        return [req("A", 0.0, steps=6, slo_ms=30_000, cost=cost),
                req("B", 1.0, steps=2, slo_ms=4_000, cost=cost)]

    guarded = run("slo", trace(), cost, order="fifo", order_margin=0.0)
    assert finish_times(guarded) == {"A": 8.0, "B": 5.0}
    assert all(r.met for r in guarded.records)
    plain = run("fifo", trace(), cost)
    assert finish_times(plain) == {"A": 6.0, "B": 8.0}
    assert [r.request.id for r in plain.records if not r.met] == ["B"]
    margin = run("slo", trace(), cost, order="fifo", order_margin=0.25)
    assert finish_times(margin) == {"A": 8.0, "B": 4.0}


def test_a_late_request_runs_in_arrival_order_only_while_the_guard_allows():
    """L (8 steps, due at 4: it cannot make it, so it is late from the start) arrives at 0
    and S (2 steps, due at 6) at 0.5. At 1 S's slack is 6 − 1 − 2 = 3 s: FIFO-first runs the
    older L (1-2, 2-3, 3-4) until S's slack is 0 at 4; S runs 4-6 (on time), L ends at 10.
    EDF runs S as soon as it is there (1-3) and L after (L ends at 10, same total), so the
    order only moves L's steps earlier while S keeps its deadline."""
    cost = table_cost()

    def trace():
        return [req("L", 0.0, steps=8, slo_ms=4_000, cost=cost),
                req("S", 0.5, steps=2, slo_ms=5_500, cost=cost)]

    fifo_first = run("slo", trace(), cost, order="fifo", order_margin=0.0)
    assert finish_times(fifo_first) == {"L": 10.0, "S": 6.0}
    edf = run("slo", trace(), cost, order="edf")
    assert finish_times(edf) == {"L": 10.0, "S": 3.0}
    assert [r.request.id for r in fifo_first.records if not r.met] == ["L"]


def test_the_default_margin_keeps_seven_tenths_of_each_window_spare():
    """The first test's trace under ``order="fifo"`` and its default margin 0.7: B's 10 s
    window keeps 7 s spare, so at 1 (slack 8 s) one step of A runs, at 2 (slack 7 s) the
    guard falls back: B 2-4, A 4-6."""
    cost = table_cost()
    reqs = [req("A", 0.0, steps=4, slo_ms=20_000, cost=cost),
            req("B", 1.0, steps=2, slo_ms=10_000, cost=cost)]
    assert finish_times(run("slo", reqs, cost, order="fifo")) == {"A": 6.0, "B": 4.0}


def test_order_options_are_checked():
    cost = table_cost()
    with pytest.raises(ValueError, match="order must be one of"):
        make_policy("slo", cost, order="sjf")
    with pytest.raises(ValueError, match="order_margin must be >= 0"):
        make_policy("slo", cost, order_margin=-0.1)
