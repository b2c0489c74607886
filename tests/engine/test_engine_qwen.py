"""The engine on the real tiny Qwen-Image generator: a request that is preempted and whose
pages go to the host and back ends with the same image as the stock diffusers pipeline
(``generator.reference``, within the 1-level uint8 tolerance documented in
``ditmem.models.qwen.generate``) and bit-identical to the same request run alone."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ditmem import models
from ditmem.engine.factory import make_policy_and_cost
from ditmem.engine.loop import Engine
from ditmem.memory import HostPool, PagePool
from ditmem.models.common.request import GenerationRequest

PAGE = 4096


@pytest.fixture(scope="module")
def gen():
    return models.load("tiny-qwen-image")


def make_engine(gen, pool_pages, policy="slo", options=None):
    policy, cost = make_policy_and_cost(policy, "cpu-tiny", options)
    pool = PagePool(pool_pages, PAGE)
    return Engine(gen, policy, cost, pool, HostPool(4 * pool_pages, PAGE)), pool


def long_request():
    return GenerationRequest(prompt="a lighthouse at dusk", width=128, height=128,
                             num_inference_steps=12, seed=11, request_id="long")


def short_request():
    return GenerationRequest(prompt="a red fox", width=64, height=64, num_inference_steps=3,
                             seed=5, request_id="short")


def test_preempted_and_offloaded_request_equals_reference(gen):
    a, b = long_request(), short_request()
    need_a, need_b = gen.estimate_pages(a, PAGE), gen.estimate_pages(b, PAGE)
    alone_engine, _ = make_engine(gen, need_a)
    alone = alone_engine.start().submit(long_request(), priority=2).future.result(300)
    alone_engine.drain(10)

    # both never fit at once; deadline order, so the urgent arrival preempts
    engine, pool = make_engine(gen, need_a + need_b - 1)
    engine.start()
    ta = engine.submit(a, priority=2, slo_ms=600_000)
    deadline = time.monotonic() + 120
    while (engine.progress("long") or 0) < 0.25:
        assert time.monotonic() < deadline, "long request never started"
        time.sleep(0.005)
    tb = engine.submit(b, priority=0, slo_ms=60_000)
    rb, ra = tb.future.result(300), ta.future.result(300)
    engine.drain(10)
    assert ra.timing.preemptions >= 1, ra.timing
    assert ra.timing.offloads >= 1, ra.timing
    assert rb.timing.finished < ra.timing.finished
    stats = engine.stats()
    assert stats.bytes_offloaded > 0 and stats.bytes_restored > 0
    assert pool.num_used_pages == 0 and engine.host.num_used_pages == 0

    np.testing.assert_array_equal(ra.output, alone.output)
    ref = gen.reference(long_request())
    assert ra.output.shape == ref.shape == (128, 128, 3)
    diff = np.abs(ra.output.astype(int) - ref.astype(int))
    assert diff.max() <= 1, diff.max()
    ref_b = gen.reference(short_request())
    assert np.abs(rb.output.astype(int) - ref_b.astype(int)).max() <= 1


def test_cancel_running_request_frees_pages(gen):
    engine, pool = make_engine(gen, 64)
    engine.start()
    t = engine.submit(GenerationRequest(prompt="x", width=64, height=64,
                                        num_inference_steps=200, seed=1, request_id="c"))
    while (engine.progress("c") or 0) == 0:
        time.sleep(0.005)
    assert pool.num_used_pages > 0
    assert engine.cancel("c")
    with pytest.raises(Exception, match="cancel"):
        t.future.result(30)
    engine.drain(10)
    assert pool.num_used_pages == 0
