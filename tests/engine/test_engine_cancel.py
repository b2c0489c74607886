"""Cancellation inside a long step (block preemption, tiny Wan with each block slowed to
0.4 s and whole steps as one chunk): a cancel takes effect at the next block boundary, not
after the step, the status and stats are live while the step runs, and every page comes
back."""

from __future__ import annotations

import threading
import time

import pytest
from test_engine_wan import wan_profile

from ditmem.engine.factory import EngineConfig, build_engine
from ditmem.engine.results import RequestCancelled
from ditmem.models.common.request import GenerationRequest

BLOCK_S = 0.4


@pytest.fixture()
def slow_engine():
    engine = build_engine(EngineConfig(model="tiny-wan", pool_mb=16, page_kb=16,
                                       preemption="block"), cost=wan_profile())
    engine.policy.fixed_chunk = 1000  # a whole step per chunk: the long-step case
    started, calls = threading.Event(), []
    advance = engine.gen.advance

    def slow_advance(step, stop):
        calls.append(time.monotonic())
        started.set()
        time.sleep(BLOCK_S * (stop - step.block))
        return advance(step, stop)

    engine.gen.advance = slow_advance
    yield engine, started, calls
    engine.stop()


def test_cancel_acts_at_the_next_block_boundary(slow_engine):
    engine, started, calls = slow_engine
    assert engine.gen.num_blocks == 2
    req = GenerationRequest(prompt="waves", width=32, height=32, num_frames=5,
                            num_inference_steps=3, seed=0, request_id="long")
    ticket = engine.submit(req)
    engine.start()
    assert started.wait(60), "the step never started"
    # inside the first block of the first step: the status and stats say so already
    assert engine.status("long") == "in_progress"
    assert engine.stats().running == 1
    t0 = time.monotonic()
    engine.cancel("long")
    with pytest.raises(RequestCancelled):
        ticket.future.result(30)
    waited = time.monotonic() - t0
    # the block in flight finishes; the step's second block never starts
    assert len(calls) == 1, calls
    assert waited < 2 * BLOCK_S, waited
    deadline = time.monotonic() + 10
    while engine.pool.num_used_pages and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.pool.num_used_pages == 0 and engine.host.num_used_pages == 0


def test_stop_during_a_long_step_ends_within_one_block(slow_engine):
    engine, started, calls = slow_engine
    req = GenerationRequest(prompt="waves", width=32, height=32, num_frames=5,
                            num_inference_steps=3, seed=1, request_id="long2")
    ticket = engine.submit(req)
    engine.start()
    assert started.wait(60)
    t0 = time.monotonic()
    engine.stop()
    assert time.monotonic() - t0 < 2 * BLOCK_S
    with pytest.raises(RequestCancelled):
        ticket.future.result(0)
    assert len(calls) == 1
    assert engine.pool.num_used_pages == 0
