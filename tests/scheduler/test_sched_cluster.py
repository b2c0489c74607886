"""Replicas behind a router, simulated: reports read off a replica's simulation at t, and
placements and latencies against hand-computed FIFO schedules."""

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


def fifo(assigned, index):
    """One server, first come first served, service = standalone time."""
    clock, out = 0.0, []
    for r in sorted(assigned, key=lambda r: (r.arrival, r.id)):
        start = max(clock, r.arrival)
        clock = start + r.standalone_s
        out.append(Rec(r, start, clock))
    return out


def test_a_report_at_t_uses_nothing_after_t():
    a, b, c = req("a", 0.0, 10.0), req("b", 1.0, 2.0, priority=2), req("c", 5.0, 1.0)
    recs = fifo([a, b, c], 0)
    # at t=4: a started at 0 (6 s left), b waits (2 s), c has not arrived
    load = report_at(recs, "r", 4.0, devices=1)
    assert load.backlog_s == (0.0, 6.0, 2.0)
    assert load.ongoing == 2 and load.reported_at == 4.0 and load.speed == 1.0
    # two devices: replica-seconds are half, and so is the speed factor
    half = report_at(recs, "r", 4.0, devices=2)
    assert half.backlog_s == (0.0, 3.0, 1.0) and half.speed == 0.5
    assert report_at(recs, "r", 20.0, devices=1).ongoing == 0


def trace():
    return [req("big", 0.0, 10.0), req("s1", 0.5, 1.0), req("s2", 1.0, 1.0),
            req("s3", 1.5, 1.0)]


def test_ditmem_keeps_small_requests_off_the_busy_replica():
    res = simulate_cluster(trace(), 2, make_router("ditmem"), fifo, report_s=100.0)
    assert res.placement == {"big": 0, "s1": 1, "s2": 1, "s3": 1}
    latency = {r.request.id: r.finished - r.request.arrival for r in res.records}
    assert latency == pytest.approx({"big": 10.0, "s1": 1.0, "s2": 1.5, "s3": 2.0})


def test_round_robin_puts_one_behind_the_big_request():
    res = simulate_cluster(trace(), 2, make_router("round-robin"), fifo, report_s=100.0)
    assert res.placement == {"big": 0, "s1": 1, "s2": 0, "s3": 1}
    latency = {r.request.id: r.finished - r.request.arrival for r in res.records}
    assert latency == pytest.approx({"big": 10.0, "s1": 1.0, "s2": 10.0, "s3": 1.0})
    assert res.refreshes == 0  # round-robin reads no reports


def test_reports_refresh_once_per_period_for_replicas_that_changed():
    res = simulate_cluster(trace(), 2, make_router("ditmem"), fifo, report_s=1.0)
    # epochs 0 (nothing routed yet) and 1 (after big and s1): both replicas re-simulated
    assert res.refreshes == 2
    assert sorted(r.request.id for r in res.records) == ["big", "s1", "s2", "s3"]


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
        simulate_cluster(trace(), 0, make_router("ditmem"), fifo)
    with pytest.raises(ValueError, match="report_s"):
        simulate_cluster(trace(), 2, make_router("ditmem"), fifo, report_s=0.0)
    with pytest.raises(ValueError, match="deadline"):
        simulate_cluster([Request(id="x", arrival=0.0)], 2, make_router("ditmem"), fifo)
