"""The demo's printed offline bound (``ditmem.tools.demo.trace_limits``) charges packed steps
in full: on a trace where splitting a packed step equally among its members forbids nothing,
the proportional split (``scheduler.bound``, ``work="proportional"``) forbids one miss, and
the demo prints the tighter of the two. Hand-computed: one 1024² and three 512², 2 steps
each, all at 0; the best batch {1024², 512² × 3} costs 4.2 s a step (the scheduler tests'
table: 512² alone 1.0 s, 1024² alone 4.0 s), so all four on time need 4 encodes (0.2 s),
2 such steps (8.4 s) and 4 decodes (0.2 s/MP: 1.048576 + 3 × 0.262144 s) = 8.967 s."""

import pytest
from sched_factories import req, table_cost

from ditmem.tools.demo import trace_limits

POINTS = [{"tokens": 1024, "batch": 2, "seconds": 1.5},
          {"tokens": 4096, "batch": 2, "seconds": 7.0},
          {"tokens": 1024, "batch": 4, "seconds": 2.4}]
NEED = 4 * 0.05 + 2 * 4.2 + 0.2 * (1024 * 1024 + 3 * 512 * 512) / 1e6


def _trace(cost, slack):
    sizes = [1024, 512, 512, 512]
    return [req(f"r{k}", 0.0, size=s, steps=2, slo_ms=1000 * slack, cost=cost)
            for k, s in enumerate(sizes)]


def test_the_printed_bound_charges_packed_steps_in_full():
    cost = table_cost(batch_points=POINTS, encode_s=0.05, decode_s_per_mp=0.2)
    assert trace_limits(_trace(cost, NEED + 1e-6), cost)["bound_attainment"] == 1.0
    # 0.01 s short: one request must miss (the equal split would still allow all four)
    assert trace_limits(_trace(cost, NEED - 0.01), cost)["bound_attainment"] == 0.75


def test_the_trace_load_is_its_own_arrival_rate_times_its_mean_standalone_time():
    """Two 512² (2 steps of 1 s, encode 0.05 s, decode 0.2 s/MP × 0.262144 MP) arriving at 0
    and 10 s: one arrival per 10 s, 2.102 s each alone: load 0.2102 — whatever rate the
    trace was drawn at."""
    cost = table_cost(encode_s=0.05, decode_s_per_mp=0.2)
    trace = [req("a", 0.0, size=512, steps=2, cost=cost),
             req("b", 10.0, size=512, steps=2, cost=cost)]
    alone = 0.05 + 2 * 1.0 + 0.2 * 512 * 512 / 1e6
    assert trace_limits(trace, cost)["trace_load"] == pytest.approx(alone / 10.0)
