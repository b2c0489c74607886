"""The node's exact program (``scheduler/node/exact_bound.py``): hand cases on the pooled
node, and never beaten by a simulated node policy, misses or misses with a P95 limit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from node_factories import node_cost, run, tiled_node_cost
from sched_factories import req

pytest.importorskip("scipy", reason="the exact bound solves a MILP with scipy (bounds extra)")

from ditmem.scheduler.metrics import percentile  # noqa: E402
from ditmem.scheduler.node.exact_bound import (  # noqa: E402
    min_node_misses_exact,
    node_misses_percentile,
)
from ditmem.scheduler.node.policies import NODE_POLICIES  # noqa: E402


def _misses(result) -> int:
    return sum(not r.met for r in result.records)


def test_two_large_requests_on_a_pair_by_hand():
    # Two 1024², 4 steps of 4 s (2 s at degree 2, perfect speed-up), both at 0 on 2 devices:
    # 32 device-s at any degree. Both due at 12 s: 24 device-s of room -> one misses; one
    # at 8 s (both devices) and one by 16 s keeps every flow <= 16 with one above 8.
    nc = node_cost()
    rs = [req(i, 0, size=1024, steps=4, slo_ms=12_000, cost=nc.cost) for i in "ab"]
    assert min_node_misses_exact(rs, nc, 2, (1, 2)).misses == 1
    relaxed = [req(i, 0, size=1024, steps=4, slo_ms=16_000, cost=nc.cost) for i in "ab"]
    assert min_node_misses_exact(relaxed, nc, 2, (1, 2), limits=[(8.0, 1)]).misses == 0
    with pytest.raises(ValueError, match="flow limits"):  # both by 12 s: 32 > 24 device-s
        min_node_misses_exact(relaxed, nc, 2, (1, 2), limits=[(12.0, 0)])
    # a flow of 7 s is below the 8 s any schedule needs: no cell of P50 <= 7 s is feasible
    with pytest.raises(ValueError, match="flow limits"):
        node_misses_percentile(relaxed, nc, 2, (1, 2), q=50, value=7.0)


def test_bad_arguments_are_refused():
    nc = node_cost()
    r = req("r", 0, cost=nc.cost)
    with pytest.raises(ValueError, match="devices"):
        min_node_misses_exact([r], nc, 0, (1,))
    with pytest.raises(ValueError, match="degrees"):
        min_node_misses_exact([r], nc, 2, (1, 2, 4))


_request = st.tuples(
    st.floats(0, 12),  # arrival
    st.sampled_from([512, 1024]),
    st.integers(1, 4),  # steps
    st.floats(1.0, 3.0),  # SLO scale
)


@settings(max_examples=25, deadline=None)
@given(st.lists(_request, min_size=1, max_size=8), st.sampled_from([2, 4]), st.booleans())
def test_no_node_policy_beats_the_exact_bound(specs, devices, tiled):
    nc = tiled_node_cost() if tiled else node_cost()  # tiled: decodes split over a group
    degrees = tuple(d for d in (1, 2, 4) if d <= devices)
    rs = [req(f"r{i}", at, size=size, steps=steps, cost=nc.cost, scale=scale)
          for i, (at, size, steps, scale) in enumerate(specs)]
    plain = min_node_misses_exact(rs, nc, devices, degrees).misses
    for policy in NODE_POLICIES:
        fresh = [r.resubmitted(r.arrival) for r in rs]
        for r, orig in zip(fresh, rs, strict=True):
            r.deadline, r.standalone_s = orig.deadline, orig.standalone_s
        res = run(fresh, policy, devices, nc)
        missed = _misses(res)
        assert missed >= plain, policy
        p95 = percentile([r.latency for r in res.records], 95)
        got = node_misses_percentile(rs, nc, devices, degrees, q=95, value=p95 + 1e-9,
                                     cells=2)
        assert got.lower <= missed, (policy, p95)
