"""The deploy package's parts without a cluster: the Ray router class on fake replicas and
pending requests, engine errors across the Ray boundary, adding up replica stats."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ditmem.deploy.errors import describe_error, rebuild_error
from ditmem.deploy.remote_engine import sum_stats
from ditmem.engine import results
from ditmem.engine.stats import EngineStats
from ditmem.scheduler.routing import RouteRequest, RoutingBook, load_of


def test_engine_errors_keep_their_class_and_fields_across_the_boundary():
    cases = [results.QueueFull("full", retry_after_s=7.0),
             results.TooSlow("slow", estimate_s=30.0, limit_s=10.0),
             results.RequestTooLarge("size: too big", "size"),
             results.InvalidRequest("num_frames: 4k+1", "num_frames"),
             results.EngineStopped("draining"),
             results.EngineFault("died"), results.RequestFailed("decode failed"),
             results.RequestCancelled("client went away")]
    for exc in cases:
        back = rebuild_error(describe_error(exc))
        assert type(back) is type(exc) and str(back) == str(exc)
        for name in ("field", "retry_after_s", "estimate_s", "limit_s"):
            assert getattr(back, name, None) == getattr(exc, name, None)
        if isinstance(exc, results.SubmitError):
            assert back.status == exc.status
    odd = rebuild_error({"kind": "KeyError", "message": "'x'"})
    assert isinstance(odd, results.RequestFailed) and "KeyError" in str(odd)


def test_replica_stats_add_up_field_by_field():
    a = EngineStats(queued=2, running=1, pages_free=10, completed=5, schedule_s=0.5,
                    slo_met=[1, 2, 3], slo_missed=[0, 1, 0], draining=True, dead="x")
    b = EngineStats(queued=1, running=3, pages_free=7, completed=4, schedule_s=0.25,
                    slo_met=[4, 0, 1], slo_missed=[2, 0, 0])
    total = sum_stats([a, b])
    assert (total.queued, total.running, total.pages_free, total.completed) == (3, 4, 17, 9)
    assert total.schedule_s == pytest.approx(0.75)
    assert total.slo_met == [5, 2, 4] and total.slo_missed == [2, 1, 0]
    # flags are the ingress's to set, not a sum
    assert total.draining is False and total.dead is None


@pytest.fixture
def ray_router():
    return pytest.importorskip(
        "ditmem.deploy.router", reason="ray[serve] is not installed (pip install -e '.[ray]')")


def fake_replica(name, stats):
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=name), routing_stats=stats)


def pending(job):
    return SimpleNamespace(args=[job], kwargs={})


def test_the_router_reads_the_route_a_generate_call_carries(ray_router):
    from dataclasses import asdict

    route = RouteRequest("r1", 2.0, 3, 0, 50.0)
    assert ray_router.route_of(pending({"request": None, "route": asdict(route)})) == route
    assert ray_router.route_of(pending({"request": None})) is None  # describe() and such
    assert ray_router.route_of(SimpleNamespace(args=[], kwargs={})) is None
    assert ray_router.route_of(None) is None


def test_a_replica_without_readable_stats_counts_as_idle(ray_router):
    fresh = ray_router.load_of_replica(fake_replica("a", {}))
    broken = ray_router.load_of_replica(fake_replica("b", {"backlog_s": "?"}))
    for load, name in ((fresh, "a"), (broken, "b")):
        assert load.replica == name and load.due == () and load.ongoing == 0


def test_ranks_are_one_replica_each_best_first(ray_router):
    busy = load_of("x", [(1, 10.0, 8.0)], 100, 100, 0.0).as_dict()
    idle = load_of("y", [], 100, 100, 0.0).as_dict()
    replicas = [fake_replica("busy", busy), fake_replica("idle", idle)]
    ranks = ray_router.rank_candidates(RouteRequest("r", 1.0, 1, 1, 5.0), replicas,
                                       RoutingBook(), now=0.0)
    # on time on both (it runs before busy's work due at 10, which still ends at 9): the
    # one holding less work ranks first
    assert [[r.replica_id.unique_id for r in rank] for rank in ranks] == [["idle"], ["busy"]]
