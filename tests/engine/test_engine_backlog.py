"""Retry-After comes from the backlog: seconds of queued and running work by the cost
model (it was one request's own standalone time, whatever the queue held)."""

from __future__ import annotations

import pytest
from toy import ToyGenerator, table_profile

from ditmem.engine.loop import Engine
from ditmem.engine.results import QueueFull, TooSlow
from ditmem.memory import HostPool, PagePool
from ditmem.models.common.request import GenerationRequest
from ditmem.scheduler import CostModel, Request, make_policy


def test_queue_full_retry_after_is_the_backlog():
    cost = CostModel.from_dict(table_profile(step_s=0.5))
    engine = Engine(ToyGenerator(), make_policy("slo", cost), cost, PagePool(256, 1024),
                    HostPool(1024, 1024), max_queued=3)  # never started: all stay queued
    sizes = [(64, 64, 10), (128, 128, 20), (64, 128, 5)]
    expected = 0.0
    for i, (w, h, steps) in enumerate(sizes):
        engine.submit(GenerationRequest(prompt="x", width=w, height=h,
                                        num_inference_steps=steps, request_id=f"q{i}"))
        expected += cost.standalone_time(Request(id=f"q{i}", arrival=0.0, model="qwen-image",
                                                 width=w, height=h, steps=steps))
    assert engine.backlog_s() == pytest.approx(expected)
    with pytest.raises(QueueFull) as info:
        engine.submit(GenerationRequest(prompt="x", width=64, height=64,
                                        num_inference_steps=1, request_id="late"))
    assert info.value.retry_after_s == pytest.approx(expected)
    assert expected > 10  # far more than the late request's own 0.5 s


def test_max_standalone_s_rejects_with_the_estimate():
    cost = CostModel.from_dict(table_profile(step_s=0.5))
    engine = Engine(ToyGenerator(), make_policy("slo", cost), cost, PagePool(256, 1024),
                    HostPool(1024, 1024))
    with pytest.raises(TooSlow) as info:
        engine.submit(GenerationRequest(prompt="x", width=64, height=64,
                                        num_inference_steps=100, request_id="long"),
                      max_standalone_s=10)
    assert info.value.estimate_s > 10 and "estimated" in str(info.value)
    assert engine.stats().queued == 0
