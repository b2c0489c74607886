"""Engine mechanics on the toy generator (real pages, closed-form reference): outputs,
failure isolation, decode on a worker thread, the in-flight cap, no leaked pages."""

from __future__ import annotations

import numpy as np
import pytest
from toy import ToyGenerator, table_profile

from ditmem.engine.factory import make_policy_and_cost
from ditmem.engine.loop import Engine
from ditmem.engine.results import EngineStopped, RequestFailed, RequestTooLarge
from ditmem.memory import HostPool, PagePool
from ditmem.models.common.request import GenerationRequest
from ditmem.scheduler import CostModel


def engine(policy="slo", pages=256, **kw):
    pol, cost = make_policy_and_cost(policy, CostModel.from_dict(table_profile()))
    gen = ToyGenerator(kw.pop("step_sleep_s", 0.0))
    return Engine(gen, pol, cost, PagePool(pages, 1024), HostPool(4 * pages, 1024), **kw)


def req(i, prompt="p", side=64, steps=4):
    return GenerationRequest(prompt=prompt, width=side, height=side, num_inference_steps=steps,
                             seed=i, request_id=f"r{i}")


@pytest.mark.parametrize("policy", ["fifo", "srtf", "slo"])
@pytest.mark.parametrize("decode_workers", [0, 1])
def test_outputs_equal_reference_and_pages_return(policy, decode_workers):
    eng = engine(policy, decode_workers=decode_workers).start()
    tickets = [eng.submit(req(i, side=32 * (1 + i % 3), steps=3 + i % 4), priority=i % 3)
               for i in range(12)]
    for i, t in enumerate(tickets):
        r = t.future.result(30)
        np.testing.assert_array_equal(r.output, ToyGenerator().reference(
            req(i, side=32 * (1 + i % 3), steps=3 + i % 4)))
        assert r.timing.steps_run == 3 + i % 4
        assert r.timing.latency_s >= r.timing.running_s > 0
    assert eng.drain(10)
    assert eng.pool.num_used_pages == 0 and eng.host.num_used_pages == 0
    s = eng.stats()
    assert s.completed == 12 and sum(s.slo_met) + sum(s.slo_missed) == 12


@pytest.mark.parametrize("decode_workers", [0, 1])
def test_failures_are_isolated(decode_workers):
    eng = engine(decode_workers=decode_workers).start()
    bad = [eng.submit(req(i, prompt=p)) for i, p in
           enumerate(["fail-encode", "fail-step", "fail-decode"])]
    good = eng.submit(req(9))
    for t in bad:
        with pytest.raises(RequestFailed):
            t.future.result(30)
    np.testing.assert_array_equal(good.future.result(30).output,
                                  ToyGenerator().reference(req(9)))
    eng.drain(10)
    assert eng.pool.num_used_pages == 0 and eng.stats().failed == 3


def test_in_flight_cap_and_rejections():
    eng = engine("srtf", max_active=2, step_sleep_s=0.002)
    seen = []
    eng.add_listener(type("L", (), {"on_step": lambda self, s, b: seen.append(
        eng.executor.active.__len__()), "on_finish": lambda self, r: None})())
    eng.start()
    tickets = [eng.submit(req(i, steps=6)) for i in range(8)]
    for t in tickets:
        t.future.result(30)
    assert max(seen) <= 2
    with pytest.raises(RequestTooLarge):
        eng.submit(req(99, side=4096))
    eng.drain(10)
    with pytest.raises(EngineStopped):
        eng.submit(req(100))


def test_profile_without_the_model_is_a_clear_error():
    from ditmem.engine.factory import EngineConfig, build_engine

    with pytest.raises(ValueError, match="ditmem profile --model tiny-wan"):
        build_engine(EngineConfig(model="tiny-wan"), generator=ToyGenerator(),
                     cost=CostModel.from_dict(table_profile()))


def test_nvtx_ranges_are_a_no_op_without_nvtx():
    from ditmem.engine import tracing

    with tracing.stage_range("step", "batch=2"):
        pass
    assert tracing.NVTX_AVAILABLE == (__import__("importlib").util.find_spec("nvtx") is not None)
