"""``slo``'s serving order: the earliest deadline among on-time requests, late ones after —
hand-computed schedules (1 s per step, no encode or decode, one request per step). (An
arrival order under an EDF guard, ``order="fifo"``, did worse on the real demos and the HTTP
bench and was removed in session 17.)"""

from sched_factories import PAGE, req, table_cost

from ditmem.scheduler import make_policy
from ditmem.scheduler.simulator import simulate


def finish_times(result):
    return {rec.request.id: rec.finished for rec in result.records}


def run(reqs, cost):
    pol = make_policy("slo", cost, forecast="off", batching=False)
    return simulate(reqs, pol, page_bytes=PAGE)


def test_an_earlier_deadline_runs_at_once():
    """A (4 steps, due at 20) starts at 0; B (2 steps, due at 11) arrives at 1 and runs at
    once: B 1-3, A 3-6 (flows 6 and 2), both on time."""
    cost = table_cost()
    res = run([req("A", 0.0, steps=4, slo_ms=20_000, cost=cost),
               req("B", 1.0, steps=2, slo_ms=10_000, cost=cost)], cost)
    assert finish_times(res) == {"A": 6.0, "B": 3.0}
    assert all(r.met for r in res.records)


def test_a_late_request_yields_to_an_on_time_one():
    """L (8 steps, due at 4: it cannot make it, so it is late from the start) arrives at 0
    and S (2 steps, due at 6) at 0.5: S runs as soon as L's first step ends (1-3), L after
    (ends at 10)."""
    cost = table_cost()
    res = run([req("L", 0.0, steps=8, slo_ms=4_000, cost=cost),
               req("S", 0.5, steps=2, slo_ms=5_500, cost=cost)], cost)
    assert finish_times(res) == {"L": 10.0, "S": 3.0}
    assert [r.request.id for r in res.records if not r.met] == ["L"]
