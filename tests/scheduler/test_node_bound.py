"""The D-device bound: hand-computed cases, and no policy ever beats it (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st
from node_factories import node_cost, run
from sched_factories import req

from ditmem.scheduler.node.bound import clairvoyant_node_misses, min_node_misses
from ditmem.scheduler.node.policies import NODE_POLICIES


def _misses(result) -> int:
    return sum(not r.met for r in result.records)


def test_pooled_capacity_forces_a_miss_and_fifo_attains_the_bound():
    # Three 4-s requests due at 4 s on 2 devices: 12 s of work, 8 s of capacity -> 1 miss.
    nc = node_cost()
    rs = [req(i, 0, size=512, steps=4, slo_ms=4000, cost=nc.cost) for i in "abc"]
    assert min_node_misses(rs, nc, 2, (1, 2)) == 1
    assert _misses(run(rs, "fifo", 2, nc)) == 1
    assert min_node_misses(rs, nc, 4, (1, 2, 4)) == 0


def test_a_request_too_tight_even_at_the_best_degree_is_counted():
    nc = node_cost()
    # 512² gains nothing from parallelism: 4 steps take 4 s at any degree; 3 s is hopeless.
    tight = req("t", 0, size=512, steps=4, slo_ms=3000, cost=nc.cost)
    # 1024² at degree 4: 4 × 1.25 s = 5 s, so 5 s is feasible and 4.9 s is not.
    ok = req("ok", 0, size=1024, steps=4, slo_ms=5000, cost=nc.cost)
    no = req("no", 100, size=1024, steps=4, slo_ms=4900, cost=nc.cost)
    assert min_node_misses([tight], nc, 4, (1, 2, 4)) == 1
    assert min_node_misses([ok], nc, 4, (1, 2, 4)) == 0
    assert min_node_misses([no], nc, 4, (1, 2, 4)) == 1
    assert min_node_misses([tight, ok, no], nc, 4, (1, 2, 4)) == 2


def test_clairvoyant_reference_is_never_below_the_bound():
    nc = node_cost()
    rs = [req(f"r{i}", 0.5 * i, size=512, steps=4, slo_ms=5000, cost=nc.cost) for i in range(12)]
    assert clairvoyant_node_misses(rs, nc, 2) >= min_node_misses(rs, nc, 2, (1, 2))


_request = st.tuples(
    st.floats(0, 12),  # arrival
    st.sampled_from([512, 1024]),
    st.integers(1, 4),  # steps
    st.floats(1.0, 3.0),  # SLO scale
    st.integers(0, 2),  # priority
)


@settings(max_examples=40, deadline=None)
@given(st.lists(_request, min_size=1, max_size=9), st.sampled_from([1, 2, 4]))
def test_no_policy_beats_the_bound(specs, devices):
    nc = node_cost()
    degrees = tuple(d for d in (1, 2, 4) if d <= devices)
    rs = [
        req(f"r{i}", at, size=size, steps=steps, priority=p, cost=nc.cost, scale=scale)
        for i, (at, size, steps, scale, p) in enumerate(specs)
    ]
    bound = min_node_misses(rs, nc, devices, degrees)
    for policy in NODE_POLICIES:
        fresh = [r.resubmitted(r.arrival) for r in rs]
        for r, orig in zip(fresh, rs, strict=True):
            r.deadline, r.standalone_s = orig.deadline, orig.standalone_s
        assert _misses(run(fresh, policy, devices, nc)) >= bound, policy
