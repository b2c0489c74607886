"""Replicas behind a router, simulated: reports read off a replica's simulation at t, and
placements and latencies against hand-computed earliest-deadline-first schedules."""

from dataclasses import dataclass

import pytest

from ditmem.scheduler import CostModel, Request
from ditmem.scheduler.cluster import ReplicaRun, report_at, simulate_cluster
from ditmem.scheduler.cluster_cli import run_cluster_point
from ditmem.scheduler.cluster_replica import Resimulated
from ditmem.scheduler.routing import make_router


@dataclass
class Rec:
    request: Request
    started: float
    finished: float


def req(rid, arrival, work, priority=1, slack=100.0, steps=10):
    r = Request(id=rid, arrival=arrival, priority=priority, steps=steps)
    r.standalone_s, r.deadline = work, arrival + work + slack
    return r


def edf(assigned, index):
    """One server, earliest deadline first, preempting (the slo policy's on-time rule),
    service = standalone time in equal steps; progress logged at every step's end."""
    pending = sorted(assigned, key=lambda r: (r.arrival, r.id))
    left = {r.id: r.standalone_s for r in pending}
    started, out, clock, present = {}, [], 0.0, []
    progress: dict[str, list] = {}

    def serve(r, seconds):
        step = r.standalone_s / r.steps
        done_before = round((r.standalone_s - left[r.id]) / step, 9)
        left[r.id] -= seconds
        done_after = round((r.standalone_s - left[r.id]) / step, 9)
        for k in range(int(done_before) + 1, int(done_after) + 1):
            progress.setdefault(r.id, []).append((clock + (k - done_before) * step, k))

    while pending or present:
        if not present:
            clock = max(clock, pending[0].arrival)
        while pending and pending[0].arrival <= clock:
            present.append(pending.pop(0))
        run = min(present, key=lambda r: (r.deadline, r.id))
        started.setdefault(run.id, clock)
        until = clock + left[run.id]
        if pending and pending[0].arrival < until:
            serve(run, pending[0].arrival - clock)
            clock = pending[0].arrival
            continue
        serve(run, until - clock)
        clock = until
        present.remove(run)
        out.append(Rec(run, started[run.id], clock))
    return ReplicaRun(out, progress)


def resim(index):
    return Resimulated(edf, index)


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


def test_a_paused_request_reports_the_steps_it_has_left_not_the_time_since_it_started():
    a, c = req("a", 0.0, 10.0), req("c", 5.0, 1.0, slack=0.5)
    run = edf([a, c], 0)
    # c (deadline 6.5 < a's 110) runs 5..6: a stays paused after 5 of its 10 steps
    assert run.steps_done("a", 5.5) == 5
    assert report_at(run, "r", 5.5, devices=1).backlog_s == (0.0, 5.0 + 0.5, 0.0)
    # 'standalone less the time since it started' would have said 10 - 5.5 = 4.5 for a


def test_a_request_running_on_several_devices_reports_its_steps_not_the_clock():
    # a node ran r (10 steps, 8 s standalone) 5 steps in its first 2 s (a degree > 1)
    r = req("r", 0.0, 8.0)
    run = ReplicaRun([Rec(r, 0.0, 4.0)], {"r": [(1.0, 2), (2.0, 5)]})
    assert report_at(run, "n", 2.5, devices=2).backlog_s == (0.0, pytest.approx(2.0), 0.0)
    assert report_at(run, "n", 1.5, devices=2).backlog_s == (0.0, pytest.approx(3.2), 0.0)
    # a job still running at t counts none of its steps: 0 before the first mark
    assert report_at(run, "n", 0.5, devices=2).backlog_s == (0.0, pytest.approx(4.0), 0.0)


def trace():
    # a big request with little slack, then two small urgent ones
    return [req("big", 0.0, 10.0, slack=0.5), req("s1", 0.5, 1.0, slack=3.0),
            req("s2", 1.0, 1.0, slack=3.0)]


def test_ditmem_keeps_urgent_work_off_a_replica_where_it_would_make_another_late():
    res = simulate_cluster(trace(), 2, make_router("ditmem"), resim, report_s=100.0)
    # s1 on replica 0 would run first (earlier deadline) and push big to 11 > 10.5
    assert res.placement == {"big": 0, "s1": 1, "s2": 1}
    latency = {r.request.id: r.finished - r.request.arrival for r in res.records}
    assert latency == pytest.approx({"big": 10.0, "s1": 1.0, "s2": 1.5})
    assert all(r.finished <= r.request.deadline for r in res.records)


def test_round_robin_puts_one_ahead_of_the_big_request():
    res = simulate_cluster(trace(), 2, make_router("round-robin"), resim, report_s=100.0)
    assert res.placement == {"big": 0, "s1": 1, "s2": 0}
    latency = {r.request.id: r.finished - r.request.arrival for r in res.records}
    # s2 preempts big on replica 0 (deadline 4 < 10.5): big ends at 11, past 10.5
    assert latency == pytest.approx({"big": 11.0, "s1": 1.0, "s2": 1.0})
    assert res.refreshes == 0  # round-robin reads no reports


def test_reports_refresh_once_per_period_and_resimulate_only_replicas_that_changed():
    made = []

    def make(i):
        made.append(Resimulated(edf, i))
        return made[-1]

    res = simulate_cluster(trace(), 2, make_router("ditmem"), make, report_s=1.0)
    # epochs 0 (nothing routed yet) and 1 (after big and s1): two reports per replica,
    # each replica simulated at epoch 1 only
    assert res.refreshes == 4 and [m.runs for m in made] == [1, 1]
    assert sorted(r.request.id for r in res.records) == ["big", "s1", "s2"]


@pytest.mark.parametrize("router", ["ditmem", "pow2"])
def test_a_node_run_once_fed_live_equals_one_resimulated_at_every_report(router):
    # the reference: every replica re-simulated from t = 0 at each report (causal)
    cost = CostModel.load("h200")
    rows = [run_cluster_point(cost, "omni-mix", router, replicas=3, devices=4,
                              policy="slo", load=0.85, seeds=(3,), arrival="gamma:2",
                              slo_scale=3.0, noise=0.03, bias=0.0, report_s=2.0,
                              requests=80, stepped=stepped)
            for stepped in (True, False)]
    assert rows[0] == rows[1]


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
        simulate_cluster(trace(), 0, make_router("ditmem"), resim)
    with pytest.raises(ValueError, match="report_s"):
        simulate_cluster(trace(), 2, make_router("ditmem"), resim, report_s=0.0)
    with pytest.raises(ValueError, match="deadline"):
        simulate_cluster([Request(id="x", arrival=0.0)], 2, make_router("ditmem"), resim)
