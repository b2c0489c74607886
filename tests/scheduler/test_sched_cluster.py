"""Replicas behind a router, simulated: reports read off a replica's simulation at t, and
placements and latencies against hand-computed earliest-deadline-first schedules."""

from dataclasses import dataclass

import pytest

from ditmem.scheduler import CostModel, Request
from ditmem.scheduler.cluster import report_at, simulate_cluster
from ditmem.scheduler.cluster_cli import run_cluster_point
from ditmem.scheduler.routing import make_router


@dataclass
class Rec:
    request: Request
    started: float
    finished: float


def req(rid, arrival, work, priority=1, slack=100.0):
    r = Request(id=rid, arrival=arrival, priority=priority)
    r.standalone_s, r.deadline = work, arrival + work + slack
    return r


def edf(assigned, index):
    """One server, earliest deadline first, preempting (the slo policy's on-time rule),
    service = standalone time."""
    pending = sorted(assigned, key=lambda r: (r.arrival, r.id))
    left = {r.id: r.standalone_s for r in pending}
    started, out, clock, present = {}, [], 0.0, []
    while pending or present:
        if not present:
            clock = max(clock, pending[0].arrival)
        while pending and pending[0].arrival <= clock:
            present.append(pending.pop(0))
        run = min(present, key=lambda r: (r.deadline, r.id))
        started.setdefault(run.id, clock)
        until = clock + left[run.id]
        if pending and pending[0].arrival < until:
            left[run.id] -= pending[0].arrival - clock
            clock = pending[0].arrival
            continue
        clock = until
        present.remove(run)
        out.append(Rec(run, started[run.id], clock))
    return out


def test_a_report_at_t_uses_nothing_after_t():
    a, b = req("a", 0.0, 10.0), req("b", 1.0, 2.0, priority=2, slack=200.0)
    c = req("c", 5.0, 1.0)
    recs = edf([a, b, c], 0)
    # at t=4: a started at 0 (6 s left), b waits (2 s), c has not arrived
    load = report_at(recs, "r", 4.0, devices=1)
    assert load.backlog_s == (0.0, 6.0, 2.0)
    assert load.ongoing == 2 and load.reported_at == 4.0 and load.speed == 1.0
    # two devices: replica-seconds are half, and so is the speed factor
    half = report_at(recs, "r", 4.0, devices=2)
    assert half.backlog_s == (0.0, 3.0, 1.0) and half.speed == 0.5
    assert report_at(recs, "r", 20.0, devices=1).ongoing == 0


def trace():
    # a big request with little slack, then two small urgent ones
    return [req("big", 0.0, 10.0, slack=0.5), req("s1", 0.5, 1.0, slack=3.0),
            req("s2", 1.0, 1.0, slack=3.0)]


def test_ditmem_keeps_urgent_work_off_a_replica_where_it_would_make_another_late():
    res = simulate_cluster(trace(), 2, make_router("ditmem"), edf, report_s=100.0)
    # s1 on replica 0 would run first (earlier deadline) and push big to 11 > 10.5
    assert res.placement == {"big": 0, "s1": 1, "s2": 1}
    latency = {r.request.id: r.finished - r.request.arrival for r in res.records}
    assert latency == pytest.approx({"big": 10.0, "s1": 1.0, "s2": 1.5})
    assert all(r.finished <= r.request.deadline for r in res.records)


def test_round_robin_puts_one_ahead_of_the_big_request():
    res = simulate_cluster(trace(), 2, make_router("round-robin"), edf, report_s=100.0)
    assert res.placement == {"big": 0, "s1": 1, "s2": 0}
    latency = {r.request.id: r.finished - r.request.arrival for r in res.records}
    # s2 preempts big on replica 0 (deadline 4 < 10.5): big ends at 11, past 10.5
    assert latency == pytest.approx({"big": 11.0, "s1": 1.0, "s2": 1.0})
    assert res.refreshes == 0  # round-robin reads no reports


def test_reports_refresh_once_per_period_for_replicas_that_changed():
    res = simulate_cluster(trace(), 2, make_router("ditmem"), edf, report_s=1.0)
    # epochs 0 (nothing routed yet) and 1 (after big and s1): both replicas re-simulated
    assert res.refreshes == 2
    assert sorted(r.request.id for r in res.records) == ["big", "s1", "s2"]


def test_nodes_behind_each_router_finish_every_request():
    cost = CostModel.load("h200")
    for router in ("ditmem", "round-robin", "pow2"):
        row = run_cluster_point(cost, "seed-mix", router, replicas=2, devices=2,
                                policy="slo", load=0.7, seeds=(0,), arrival="gamma:2",
                                slo_scale=3.0, noise=0.03, bias=0.0, report_s=2.0,
                                requests=40)
        assert row["requests"] == 40 and 0.0 <= row["slo_attainment"] <= 1.0


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="replicas"):
        simulate_cluster(trace(), 0, make_router("ditmem"), edf)
    with pytest.raises(ValueError, match="report_s"):
        simulate_cluster(trace(), 2, make_router("ditmem"), edf, report_s=0.0)
    with pytest.raises(ValueError, match="deadline"):
        simulate_cluster([Request(id="x", arrival=0.0)], 2, make_router("ditmem"), edf)
