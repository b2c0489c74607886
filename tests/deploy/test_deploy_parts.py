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


def test_a_handed_off_request_is_not_sent_back_where_it_came_from(ray_router):
    a, b = fake_replica("a", {}), fake_replica("b", {})
    job = {"request_id": "r", "blob": [None], "avoid": "a",
           "route": {"id": "r", "work_s": 1.0, "pages": 1, "priority": 1, "deadline": 9.0}}
    assert ray_router.avoid_of(pending(job)) == "a"
    assert ray_router.avoid_of(pending({"request": None})) is None
    assert ray_router.without_source([a, b], "a") == [b]
    assert ray_router.without_source([a], "a") == [a]  # alone: back where it was
    assert ray_router.without_source([a, b], None) == [a, b]


def test_handoff_errors_keep_their_class_across_the_boundary():
    from ditmem.engine.handoff import BadBlob, HandoffRefused

    for exc in (BadBlob("page_bytes: 4096 vs 8192", "page_bytes"), HandoffRefused("full")):
        back = rebuild_error(describe_error(exc))
        assert type(back) is type(exc) and str(back) == str(exc)
        assert getattr(back, "field", None) == getattr(exc, "field", None)


# ---------------------------------------------------------------------------- rebalancer
class FakeBoard:
    """The board's two calls the rebalancer makes, answering ``reports`` and ``orders``."""

    def __init__(self, reports, orders=()):
        self.orders = list(orders)

        async def take(replica, live):
            mine = [r for r in self.orders if r in live]
            self.orders = [r for r in self.orders if r not in mine]
            return mine

        async def snapshot():
            return reports

        self.take_orders = SimpleNamespace(remote=take)
        self.snapshot = SimpleNamespace(remote=snapshot)


def replica_on(engine, board, **moves):
    """An ``EngineReplica`` without Ray Serve around it (its rebalancer's state only);
    ``put`` keeps blobs in a dict instead of the object store."""
    import collections

    from ditmem.deploy.replica import EngineReplica, MoveOptions
    from ditmem.engine.handoff import export_parked

    r = object.__new__(EngineReplica)
    r.name, r.engine, r.board = "here", engine, board
    r.move_options = MoveOptions(**moves)
    r.streams, r.outgoing, r.hops, r.adopted_at = set(), {}, {}, {}
    r.move_book = RoutingBook()
    r.move_log = collections.deque(maxlen=8)
    r.moved = {"out": 0, "in": 0}
    r.store = {}

    def put(blob):
        r.store[len(r.store)] = blob
        return len(r.store) - 1

    r.put = put
    # the engine thread is this test: export directly (Handoff's queueing is tested with
    # the engine, tests/engine/test_engine_handoff.py)
    engine.handoff.export = lambda rid, source="": export_parked(engine, rid, source)
    return r


@pytest.fixture(scope="module")
def tiny_gen():
    from ditmem import models

    return models.load("tiny-qwen-image")


def parked_engine(gen):
    """An unstarted engine where "p" (64x64, 30 steps) has run 2 steps and "x" (a big
    request, never started) waits; deadlines set by hand (engine clock)."""
    from ditmem.engine.factory import make_policy_and_cost
    from ditmem.engine.loop import Engine
    from ditmem.memory import HostPool, PagePool
    from ditmem.models.common.request import GenerationRequest

    policy, cost = make_policy_and_cost("slo", "cpu-tiny")
    engine = Engine(gen, policy, cost, PagePool(256, 4096), HostPool(1024, 4096))
    ticket = engine.submit(GenerationRequest(prompt="a fox", width=64, height=64,
                                             num_inference_steps=30, seed=3,
                                             request_id="p"), slo_ms=600_000)
    while (engine.executor.active.get("p") is None
           or engine.executor.active["p"].status.steps_done < 2):
        engine.executor.iterate()
    engine.submit(GenerationRequest(prompt="a city", width=1024, height=1024,
                                    num_inference_steps=200, seed=4, request_id="x"),
                  slo_ms=600_000)
    engine.executor.take_intake()  # x waits; nothing runs until the test iterates again
    return engine, ticket


def run(coro):
    import asyncio

    return asyncio.run(coro)


def test_the_rebalancer_moves_a_request_late_here_and_on_time_elsewhere(tiny_gen):
    import asyncio
    import time

    pytest.importorskip("ray", reason="ray[serve] is not installed")
    engine, _ = parked_engine(tiny_gen)
    jobs = engine.intake.live
    now = engine.clock()
    p_left = engine.cost.remaining_time(jobs["p"].sched, 2)
    x_left = jobs["x"].sched.standalone_s
    assert x_left > 10 * p_left
    # x is due first and takes its time: p, due 2 s after its own rest, finishes late here
    jobs["x"].sched.deadline = now + 1.0
    jobs["p"].sched.deadline = now + p_left + 2.0
    idle = load_of("there", [], 100, 100, time.time()).as_dict()
    busy = load_of("there", [(1, time.time() + 0.5, 60.0)], 100, 100, time.time()).as_dict()

    async def scenario(report, expect, **moves):
        replica = replica_on(engine, FakeBoard({"there": {"at": time.time(),
                                                          "load": report}}), **moves)
        replica.streams.add("p")
        ticket = engine.executor.active["p"].ticket
        messages = []

        async def follow():
            async for m in replica._follow("p", ticket):
                messages.append(m)

        task = asyncio.get_running_loop().create_task(follow()) if expect else None
        await replica._rebalance()
        if task is not None:
            await asyncio.wait_for(task, 5)
        return replica, messages

    replica, _ = run(scenario(busy, False))  # late there too: it stays
    assert replica.moved["out"] == 0 and "p" in engine.executor.active
    replica, _ = run(scenario(idle, False, rule=False))  # the rule off: it stays
    assert replica.moved["out"] == 0 and "p" in engine.executor.active
    replica, messages = run(scenario(idle, True, move_s=0.5))
    assert replica.moved["out"] == 1 and "p" not in engine.executor.active
    (moved,) = messages
    assert moved["replica"] == "here" and moved["hops"] == 1 and moved["steps_done"] == 2
    blob = replica.store[moved["moved"][0]]
    assert blob.request_id == "p" and blob.steps_done == 2 and blob.source == "here"
    route = RouteRequest(**moved["route"])
    assert route.work_s == pytest.approx(p_left / engine.cost.correction(engine.model))
    assert route.deadline == pytest.approx(time.time() + p_left + 2.0, abs=1.0)
    assert replica.move_log[-1]["digest"] == blob.digest


def test_an_ordered_move_happens_whatever_the_rule_says(tiny_gen):
    import asyncio
    import time

    pytest.importorskip("ray", reason="ray[serve] is not installed")
    engine, ticket = parked_engine(tiny_gen)  # p on time here: the rule keeps it

    async def scenario():
        replica = replica_on(engine, FakeBoard({}, orders=["p", "gone"]))
        replica.streams.add("p")
        messages = []

        async def follow():
            async for m in replica._follow("p", ticket):
                messages.append(m)

        task = asyncio.get_running_loop().create_task(follow())
        await replica._rebalance()
        await asyncio.wait_for(task, 5)
        return replica, messages

    start = time.monotonic()
    replica, messages = run(scenario())
    assert time.monotonic() - start < 5
    assert replica.moved["out"] == 1 and "moved" in messages[0]
    assert replica.move_log[-1]["why"] == "ordered"
    assert engine.pool.num_used_pages == 0 and engine.host.num_used_pages == 0


def test_a_blob_the_object_store_refuses_stays_and_finishes_here(tiny_gen):
    import asyncio

    pytest.importorskip("ray", reason="ray[serve] is not installed")
    from ditmem.engine.handoff import adopt_blob

    engine, ticket = parked_engine(tiny_gen)
    engine.cancel("x")  # only p runs once the engine starts

    def full(blob):
        raise MemoryError("object store full")

    async def scenario():
        replica = replica_on(engine, FakeBoard({}, orders=["p"]))
        replica.put = full
        engine.handoff.adopt = lambda blob: adopt_blob(engine, blob)
        replica.streams.add("p")
        messages = []

        async def follow():
            async for m in replica._follow("p", ticket):
                messages.append(m)

        task = asyncio.get_running_loop().create_task(follow())
        await replica._rebalance()
        assert "p" in engine.executor.active  # back, paused on the host
        engine.start()
        await asyncio.wait_for(task, 120)
        return replica, messages

    replica, messages = run(scenario())
    assert engine.drain(10)
    assert [list(m) for m in messages] == [["result", "replica"]]
    assert messages[0]["result"].timing.steps_run == 30
    assert replica.moved["out"] == 0
    assert engine.pool.num_used_pages == 0 and engine.host.num_used_pages == 0


def test_a_replica_finalizer_never_blocks_on_its_engine(tiny_gen):
    import threading
    import time

    pytest.importorskip("ray", reason="ray[serve] is not installed")
    engine, _ = parked_engine(tiny_gen)
    replica = replica_on(engine, FakeBoard({}))
    # The garbage collector may finalize a replica on a thread that holds the engine's
    # intake lock (seen: a collection inside _parked_routes' locked section hung the
    # suite). Here another thread holds it: the finalizer must still return at once.
    finalized = threading.Event()
    with engine.intake.lock:
        worker = threading.Thread(target=lambda: (replica.__del__(), finalized.set()),
                                  daemon=True)
        worker.start()
        assert finalized.wait(5.0), "EngineReplica.__del__ blocked on the engine's lock"
        assert not engine.intake.stopping  # the stop waits for the lock, off this thread
    deadline = time.monotonic() + 5.0
    while not engine.intake.stopping and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.intake.stopping  # and happens once the lock is free
