"""Engine health: an iteration that raises fails only the requests it held (EngineFault)
and the loop goes on; one it cannot survive marks the engine dead, fails every waiting
request and refuses new ones; no page leaks either way."""

from __future__ import annotations

import time

import numpy as np
import pytest
from toy import ToyGenerator, table_profile

from ditmem.engine.loop import Engine
from ditmem.engine.results import EngineFault, EngineStopped
from ditmem.memory import HostPool, PagePool
from ditmem.models.common.request import GenerationRequest
from ditmem.scheduler import CostModel, make_policy


def toy_engine(step_sleep_s=0.002) -> Engine:
    cost = CostModel.from_dict(table_profile())
    return Engine(ToyGenerator(step_sleep_s), make_policy("slo", cost), cost,
                  PagePool(256, 1024), HostPool(1024, 1024))


def req(i, steps=8) -> GenerationRequest:
    return GenerationRequest(prompt=f"p{i}", width=64, height=64, num_inference_steps=steps,
                             seed=i, request_id=f"r{i}")


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_killed_step_fails_only_the_requests_it_held():
    engine = toy_engine()
    ex = engine.executor
    step, calls, killed = ex._step, [0], []

    def killing_step(batch, report, blocks=None):
        calls[0] += 1
        if calls[0] == 5:
            killed.extend(j.id for j in batch)
            raise RuntimeError("step function killed")
        return step(batch, report, blocks)

    ex._step = killing_step
    reqs = [req(i) for i in range(6)]
    tickets = [engine.submit(r) for r in reqs]
    engine.start()
    outcomes = {}
    for r, t in zip(reqs, tickets, strict=True):
        try:
            outcomes[r.request_id] = t.future.result(30).output
        except EngineFault as exc:
            outcomes[r.request_id] = exc
    assert killed, "the step was never killed"
    failed = {k for k, v in outcomes.items() if isinstance(v, EngineFault)}
    assert failed == set(killed)
    assert all("step function killed" in str(outcomes[k]) for k in failed)
    for r in reqs:
        if r.request_id not in failed:
            np.testing.assert_array_equal(outcomes[r.request_id], ToyGenerator().reference(r))
    # still serving
    after = engine.submit(req(99, steps=2)).future.result(30)
    np.testing.assert_array_equal(after.output, ToyGenerator().reference(req(99, steps=2)))
    s = engine.stats()
    assert s.dead is None and s.failed == len(failed)
    wait_for(lambda: engine.pool.num_used_pages == 0)
    engine.drain(10)


def test_an_engine_that_cannot_go_on_is_dead():
    engine = toy_engine(step_sleep_s=0.01)
    schedule = engine.policy.schedule
    broken = [False]

    def schedule_or_raise(now, view):
        if broken[0]:
            raise MemoryError("policy state lost")
        return schedule(now, view)

    engine.policy.schedule = schedule_or_raise
    tickets = [engine.submit(req(i, steps=200)) for i in range(3)]
    engine.start()
    wait_for(lambda: engine.stats().steps >= 2)
    broken[0] = True
    for t in tickets:
        with pytest.raises(EngineFault, match="engine died"):
            t.future.result(30)
    s = engine.stats()
    assert s.dead is not None and "policy state lost" in s.dead
    with pytest.raises(EngineStopped, match="dead"):
        engine.submit(req(7))
    assert engine.pool.num_used_pages == 0 and engine.host.num_used_pages == 0
    assert engine.drain(5) is False
