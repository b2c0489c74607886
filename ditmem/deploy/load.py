"""What an engine replica reports: its backlog by priority, slack and pages (no Ray here).

Times leave the replica on the wall clock (``time.time()``): the router compares them with
its own, and replicas on other nodes share no ``perf_counter`` origin.
"""

from __future__ import annotations

import time

from ditmem.scheduler.routing import ReplicaLoad, load_of


def replica_load(engine, replica: str, wall_now: float | None = None) -> ReplicaLoad:
    """The :class:`ReplicaLoad` of a running :class:`ditmem.engine.Engine` now.

    Remaining work per request is the engine's cost model's (``remaining_time`` of a started
    request, ``standalone_s`` of a queued one), as in ``Engine.backlog_s``; ``speed`` is the
    cost model's measured/predicted step factor, so the router prices new requests as this
    replica has been running them."""
    wall = time.time() if wall_now is None else wall_now
    offset = wall - engine.clock()
    with engine.intake.lock:
        jobs = list(engine.intake.live.values())
    items = []
    for job in jobs:
        sched, status = job.sched, job.status
        if status is None:
            remaining = sched.standalone_s or 0.0
        else:
            remaining = engine.cost.remaining_time(sched, status.steps_done,
                                                   status.blocks_done)
        items.append((sched.priority, sched.deadline + offset, remaining))
    stats = engine.stats()
    speed = engine.cost.correction(engine.model)
    return load_of(replica, items, stats.pages_free, engine.pool.num_pages, wall, speed,
                   ids=[job.id for job in jobs])


def live_progress(engine) -> dict[str, float]:
    """Fraction of steps done of each started request (queued ones are absent)."""
    with engine.intake.lock:
        jobs = list(engine.intake.live.values())
    return {job.id: job.status.steps_done / max(1, job.sched.steps)
            for job in jobs if job.status is not None}
