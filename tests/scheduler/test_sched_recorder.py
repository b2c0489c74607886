"""scheduler.policies.recorder: an observed or logged policy decides as the policy; timelines
by hand."""

import dataclasses

import pytest
from sched_factories import req, table_cost

from ditmem.scheduler import CostModel, make_policy
from ditmem.scheduler.policies.recorder import (
    Decision,
    DecisionLog,
    ObservingPolicy,
    describe,
    timeline,
)
from ditmem.scheduler.simulator import simulate
from ditmem.scheduler.workloads import workload


@pytest.mark.parametrize("policy", ["fifo", "slo"])
def test_the_logged_policy_decides_as_the_policy(policy):
    cost = CostModel.load("h200")
    reqs = workload("seed-mix", cost, requests=120, seed=2, load=0.9)
    plain = simulate([dataclasses.replace(r) for r in reqs], make_policy(policy, cost.fresh()))
    logged = DecisionLog(make_policy(policy, cost.fresh()))
    res = simulate([dataclasses.replace(r) for r in reqs], logged)
    assert [(r.request.id, r.finished) for r in res.records] == \
        [(r.request.id, r.finished) for r in plain.records]
    assert all(d.ran == d.batch for d in logged.log if d.batch)  # inline decodes: plans run
    steps = sum(len(d.batch) for d in logged.log)
    assert steps == sum(r.steps for r in reqs)  # one packed step per decision with a batch
    rows = [d.as_row() for d in logged.log]
    assert [Decision.from_row(r) for r in rows] == logged.log


def test_timeline_of_a_request_waiting_behind_another_under_fifo():
    # 512² steps take 1 s (4 steps, no encode/decode): a runs 0-4 s, b (arrives 0.5) 4-8 s.
    cost = table_cost()
    a, b = req("a", 0.0, cost=cost), req("b", 0.5, cost=cost)
    logged = DecisionLog(make_policy("fifo", cost.fresh()))
    res = {r.request.id: r for r in simulate([a, b], logged).records}
    assert res["b"].finished == pytest.approx(8.0)
    segs = timeline(logged.log, "b", 0.5, res["b"].finished)
    assert [s.state for s in segs] == ["waits", "runs"]
    assert (segs[0].start, segs[0].end) == pytest.approx((1.0, 4.0))
    assert segs[0].decisions == 3 and segs[0].others == {"a": 3}
    assert segs[1].decisions == 4 and not segs[1].others
    assert "ran: a×3" in describe(segs)


def test_a_timeline_ends_before_the_decision_at_the_finish_time():
    # fifo, 1-s steps: a runs 0-4 s, b 4-8 s, c 8-12 s; the simulator decides again at 4 s
    # and 8 s, when a and b have finished: those decisions are not theirs to wait in
    cost = table_cost()
    reqs = [req("a", 0.0, cost=cost), req("b", 0.5, cost=cost), req("c", 1.0, cost=cost)]
    logged = DecisionLog(make_policy("fifo", cost.fresh()))
    res = {r.request.id: r for r in simulate(reqs, logged).records}
    assert [res[i].finished for i in "abc"] == pytest.approx([4.0, 8.0, 12.0])
    segs = timeline(logged.log, "a", 0.0, res["a"].finished)
    assert [(s.state, s.start, s.end, s.decisions) for s in segs] == [("runs", 0.0, 3.0, 4)]
    segs = timeline(logged.log, "b", 0.5, res["b"].finished)
    assert [(s.state, s.decisions) for s in segs] == [("waits", 3), ("runs", 4)]
    assert (segs[1].start, segs[1].end) == pytest.approx((4.0, 7.0))
    assert not segs[1].others  # c's first step (the decision at 8 s) is not b's to see


def test_a_timeline_shows_the_decisions_a_request_spent_decoding():
    # fifo, tiled decodes: a's 4 steps 0-4 s, then its 1-s decode (one tile) runs instead
    # of b's first planned step; b steps 5-9 s, then its own decode (9-10 s)
    cost = table_cost(decode_s_per_mp=1.0 / (512 * 512 / 1e6))
    reqs = [req("a", 0.0, cost=cost), req("b", 0.5, cost=cost)]
    logged = DecisionLog(make_policy("fifo", cost.fresh()))
    res = {r.request.id: r for r in simulate(reqs, logged, decode="tiled").records}
    assert (res["a"].finished, res["b"].finished) == pytest.approx((5.0, 10.0))
    segs = timeline(logged.log, "a", 0.0, 5.0)
    assert [(s.state, s.start, s.decisions) for s in segs] == [("runs", 0.0, 4),
                                                                ("decodes", 4.0, 1)]
    segs = timeline(logged.log, "b", 0.5, 10.0)
    assert [(s.state, s.start, s.decisions) for s in segs] == [
        ("waits", 1.0, 3), ("planned", 4.0, 1), ("runs", 5.0, 4), ("decodes", 9.0, 1)]
    rows = [d.as_row() for d in logged.log]
    assert [Decision.from_row(r) for r in rows] == logged.log


@pytest.mark.parametrize("tail", ["late", "fifo"])
def test_only_given_up_requests_wait_late(tail):
    # slo, 1-s steps: a runs 0-4 s; b (due at 60.5 s) waits 1-3 s on time. With
    # tail="fifo" the tail lane holds every arrival (a FIFO promise each), late or not.
    cost = table_cost()
    reqs = [req("a", 0.0, cost=cost), req("b", 0.5, cost=cost, slo_ms=60_000)]
    logged = DecisionLog(make_policy("slo", cost.fresh(), tail=tail))
    res = {r.request.id: r for r in simulate(reqs, logged).records}
    assert all(r.finished <= r.request.deadline for r in res.values())
    assert all(d.late == () for d in logged.log)
    segs = timeline(logged.log, "b", 0.5, res["b"].finished)
    assert [s.state for s in segs] == ["waits", "runs"]


def test_a_given_up_request_waits_late():
    # a (4 x 1-s steps, due at 3 s) cannot make it: slo gives it up at once and runs b
    cost = table_cost()
    reqs = [req("a", 0.0, cost=cost, slo_ms=3_000), req("b", 0.0, cost=cost, slo_ms=60_000)]
    logged = DecisionLog(make_policy("slo", cost.fresh()))
    res = {r.request.id: r for r in simulate(reqs, logged).records}
    assert res["a"].finished > res["a"].request.deadline
    assert logged.log[0].late == ("a",) and logged.log[0].batch == ("b",)
    segs = timeline(logged.log, "a", 0.0, res["a"].finished)
    assert segs[0].state == "waits late"


def test_a_chunked_steps_seconds_are_all_logged():
    # block preemption: between arrivals the simulator continues a part-done step without
    # deciding again; those chunks belong to the decision that started it. fifo runs one
    # request at a time and the timings are exact, so the logged step seconds add up to
    # every request's steps alone.
    cost = CostModel.load("h200")
    reqs = workload("seed-mix", cost, requests=20, seed=1, load=0.9)
    logged = DecisionLog(make_policy("fifo", cost.fresh()))
    simulate([dataclasses.replace(r) for r in reqs], logged, preemption="block")
    alone = sum(r.steps * cost.step_time(r.model, [cost.tokens(r)]) for r in reqs)
    assert sum(d.step_s or 0.0 for d in logged.log) == pytest.approx(alone, rel=1e-9)


def test_a_logged_observed_policy_copies_and_pickles():
    # the wrappers delegate unknown attributes; a copy or an unpickled one has none set yet
    import copy
    import pickle

    cost = table_cost()
    reqs = [req("a", 0.0, cost=cost), req("b", 0.5, cost=cost)]
    logged = DecisionLog(ObservingPolicy(make_policy("fifo", cost.fresh()), id))
    for twin in (copy.deepcopy(logged), pickle.loads(pickle.dumps(logged))):
        res = simulate([dataclasses.replace(r) for r in reqs], twin)
        assert [r.finished for r in res.records] == pytest.approx([4.0, 8.0])
        assert len(twin.log) == 8 and not logged.log


def test_the_observing_policy_sees_every_report_and_passes_it_on():
    seen, inner_seen = [], []

    class Policy:
        name = "slo"

        def observe(self, r):
            inner_seen.append(r)

        def schedule(self, now, view):
            return ("plan", now)

    p = ObservingPolicy(Policy(), seen.append)
    p.observe("r1")
    assert seen == ["r1"] and inner_seen == ["r1"]
    assert p.schedule(3, None) == ("plan", 3) and p.name == "slo"

    class NoObserve:
        pass

    ObservingPolicy(NoObserve(), seen.append).observe("r2")
    assert seen == ["r1", "r2"]


def test_the_log_records_each_give_up_with_what_slo_saw():
    # 1-s steps, no encode/decode, no forecast, all at 0: X (5 steps, due 4) cannot finish
    # even alone; A (3 steps, due 4) and B (4 steps, due 6) overrun B's deadline (7 > 6),
    # and the give-up rule picks B (4 / 2 > 3 / 2). Both are set aside in the first
    # decision, and only there.
    cost = table_cost()
    reqs = [req("X", 0.0, steps=5, slo_ms=4_000, cost=cost),
            req("A", 0.0, steps=3, slo_ms=4_000, cost=cost),
            req("B", 0.0, steps=4, slo_ms=6_000, cost=cost)]
    logged = DecisionLog(make_policy("slo", cost.fresh(), forecast="off"))
    simulate(reqs, logged)
    first, *rest = logged.log
    assert sorted(first.gave_up) == [("B", pytest.approx(4.0), pytest.approx(6.0), False),
                                     ("X", pytest.approx(5.0), pytest.approx(4.0), True)]
    assert all(d.gave_up == () for d in rest)
    assert Decision.from_row(first.as_row()) == first
