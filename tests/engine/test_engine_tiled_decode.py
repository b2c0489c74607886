"""The engine with ``decode="tiled"`` on the real tiny Qwen-Image: a large image's decode
yields to an urgent request between tiles; both outputs equal the requests run alone (the
large one with the stock VAE's own tiled decode); no page is left behind."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ditmem import models
from ditmem.engine.factory import make_policy_and_cost
from ditmem.engine.loop import Engine
from ditmem.memory import HostPool, PagePool
from ditmem.models.common.request import GenerationRequest
from ditmem.models.qwen.pipeline import decode_latents

PAGE = 4096
TILE = (64, 48)  # a 192² image decodes as 4 x 4 tiles


@pytest.fixture(scope="module")
def gen():
    return models.load("tiny-qwen-image")


def make_engine(gen, **kw):
    policy, cost = make_policy_and_cost("slo", "cpu-tiny")
    return Engine(gen, policy, cost, PagePool(512, PAGE), HostPool(2048, PAGE), **kw)


def large():
    return GenerationRequest(prompt="a harbour", width=192, height=192, num_inference_steps=2,
                             seed=3, request_id="large")


def small():
    return GenerationRequest(prompt="a fox", width=64, height=64, num_inference_steps=2,
                             seed=4, request_id="small")


def stock_tiled_image(gen, state):
    """The pipeline's decode tail with the stock VAE's own tiling at ``TILE``."""
    vae = gen.pipe.vae
    vae.enable_tiling(tile_sample_min_height=TILE[0], tile_sample_min_width=TILE[0],
                      tile_sample_stride_height=TILE[1], tile_sample_stride_width=TILE[1])
    try:
        return decode_latents(gen.pipe, gen.latents(state), state.scalars["height"],
                              state.scalars["width"])
    finally:
        vae.disable_tiling()
        vae.enable_tiling(tile_sample_min_height=256, tile_sample_min_width=256,
                          tile_sample_stride_height=192, tile_sample_stride_width=192)
        vae.disable_tiling()


def test_inline_decode_in_tiles_equals_the_stock_tiled_decode(gen):
    engine = make_engine(gen, decode="inline", decode_tile=TILE).start()
    result = engine.submit(large()).future.result(120)
    assert engine.drain(10) and engine.pool.num_used_pages == 0
    pool = PagePool(512, PAGE)
    state = gen.encode(large(), pool)
    while not gen.is_done(state):
        gen.step([state])
    np.testing.assert_array_equal(result.output, stock_tiled_image(gen, state))
    gen.release(state)



def _gate_first_tile(tiles):
    """Hold the engine's first decode tile until ``submitted`` is set (the test queues its
    second request meanwhile); ``decoding`` is set once that tile has been reached."""
    decoding, submitted = threading.Event(), threading.Event()
    run = tiles.run

    def gated_run(job_id):
        decoding.set()
        assert submitted.wait(60)
        return run(job_id)

    tiles.run = gated_run
    return decoding, submitted


def test_urgent_request_overtakes_a_tiled_decode(gen):
    engine = make_engine(gen, decode="tiled", decode_tile=TILE)
    tiles = engine.executor.tiles
    decoding, submitted = _gate_first_tile(tiles)
    engine.start()
    t_large = engine.submit(large(), priority=2, slo_ms=600_000)
    assert decoding.wait(120)
    t_small = engine.submit(small(), priority=0, slo_ms=60_000)
    submitted.set()
    r_small, r_large = t_small.future.result(120), t_large.future.result(120)
    assert engine.drain(10)
    assert r_small.timing.finished < r_large.timing.finished
    assert tiles.tiles_run == 16 + 1  # the small image fits one tile: decoded whole
    assert engine.pool.num_used_pages == 0 and engine.host.num_used_pages == 0

    # the same requests alone, whole steps, decoded by the stock pipeline tail
    pool = PagePool(512, PAGE)
    alone = {}
    for req in (large(), small()):
        state = gen.encode(req, pool)
        while not gen.is_done(state):
            gen.step([state])
        alone[req.request_id] = state
    np.testing.assert_array_equal(r_small.output, gen.decode(alone["small"]))
    np.testing.assert_array_equal(r_large.output, stock_tiled_image(gen, alone["large"]))
    for state in alone.values():
        gen.release(state)


def test_tiled_decode_setup_errors(gen):
    from toy import ToyGenerator

    with pytest.raises(ValueError, match="has no tiled decode"):
        policy, cost = make_policy_and_cost("slo", "cpu-tiny")
        Engine(ToyGenerator(), policy, cost, PagePool(8, PAGE), HostPool(8, PAGE),
               decode="tiled")
    with pytest.raises(ValueError, match="decode_workers 0"):
        make_engine(gen, decode="tiled", decode_workers=1)
    with pytest.raises(ValueError, match="0 or 1"):
        make_engine(gen, decode_workers=2)
    with pytest.raises(ValueError, match="'inline' or 'tiled'"):
        make_engine(gen, decode="later")


def test_cancel_during_a_tiled_decode_frees_pages(gen):
    engine = make_engine(gen, decode="tiled", decode_tile=TILE)
    tiles = engine.executor.tiles
    decoding, cancelled = threading.Event(), threading.Event()
    run = tiles.run

    def gated_run(job_id):
        decoding.set()
        assert cancelled.wait(60)
        return run(job_id)

    tiles.run = gated_run
    engine.start()
    ticket = engine.submit(large(), priority=1)
    assert decoding.wait(120)
    assert engine.cancel("large")
    cancelled.set()
    with pytest.raises(Exception, match="cancel"):
        ticket.future.result(30)
    assert engine.drain(10)
    assert engine.pool.num_used_pages == 0 and len(tiles) == 0


@pytest.mark.parametrize("margin, large_first", [(0.2, True), (None, False)])
def test_a_late_decode_takes_the_time_the_plan_spares(gen, margin, large_first):
    """Issue 13 (session 9): the executor runs a late decode's tiles in the time slo's plan
    grants them (``StepPlan.late_tiles_s``). "large" (1-s SLO) meets its deadline through
    its steps, and its decode, held at the first tile, passes it: a late decode outside the
    tail lane (never given up, so its tiles do not go first). "small" then arrives with a
    600-s SLO: with the grant (``late_tile_margin`` 0.2, an option) the large image's 16
    tiles all run before small's steps (its slack is hundreds of seconds); without it
    (None, the default) small's steps and decode go first. (The late decodes'
    ``late_share`` credit is set to 0 here, so only the grant lets a late tile run while a
    step is planned.)"""
    policy, cost = make_policy_and_cost("slo", "cpu-tiny", {"late_tile_margin": margin})
    engine = Engine(gen, policy, cost, PagePool(512, PAGE), HostPool(2048, PAGE),
                    decode="tiled", decode_tile=TILE)
    tiles = engine.executor.tiles
    tiles._order.late_share = 0.0
    decoding, submitted = _gate_first_tile(tiles)
    engine.start()
    t_large = engine.submit(large(), priority=2, slo_ms=1_000)
    assert decoding.wait(120)
    time.sleep(1.2)  # past large's deadline (it arrived before its decode was reached)
    t_small = engine.submit(small(), priority=1, slo_ms=600_000)
    submitted.set()
    r_small, r_large = t_small.future.result(120), t_large.future.result(120)
    assert engine.drain(10)
    assert r_large.timing.finished > r_large.timing.arrival + 1.0  # its decode went late
    assert (r_large.timing.finished < r_small.timing.finished) is large_first
    assert engine.pool.num_used_pages == 0 and engine.host.num_used_pages == 0


def test_the_policy_sees_each_pending_decode_and_its_tiles_left(gen):
    engine = make_engine(gen, decode="tiled", decode_tile=TILE)
    policy, seen = engine.policy, []
    schedule = policy.schedule

    def recording(now, view):
        seen.append(tuple((d.request.id, d.tiles_left, d.tiles) for d in view.decodes))
        return schedule(now, view)

    policy.schedule = recording
    engine.start()
    engine.submit(large()).future.result(120)
    assert engine.drain(10) and engine.pool.num_used_pages == 0
    pending = [s[0] for s in seen if s]
    assert [left for _, left, _ in pending] == list(range(16, 0, -1))  # 4 x 4 tiles, one a pick
    assert {(rid, n) for rid, _, n in pending} == {("large", 16)}


def test_a_decode_the_plan_names_whole_goes_first_and_is_reported(gen):
    """``StepPlan.first_decodes`` (``slo`` names the tail lane's members: with
    ``tail="fifo"`` every request): with ``decode="tiled"`` the large request's decode is
    queued to go first (``TiledDecodes.push(first=True)``: its tiles run before any step
    the plan does not hold them for), and once delivered it is reported with the next
    step's report (the cost model learns decodes from it: the small request submitted
    after it); with the default lane (nobody promised while on time) its tiles are queued
    as any decode and not reported. Both images equal the stock VAE's own tiled decode."""
    outputs = {}
    for tail in ("fifo", "late"):
        policy, cost = make_policy_and_cost("slo", "cpu-tiny", {"tail": tail})
        seen = []
        observe = policy.observe

        def record(report, seen=seen, observe=observe):
            seen.append(report)
            observe(report)

        policy.observe = record
        engine = Engine(gen, policy, cost, PagePool(512, PAGE), HostPool(2048, PAGE),
                        decode="tiled", decode_tile=TILE)
        starts = []
        start = engine.executor.tiles.start

        def recording_start(job, first=False, starts=starts, start=start):
            starts.append((job.id, first))
            return start(job, first)

        engine.executor.tiles.start = recording_start
        engine.start()
        outputs[tail] = engine.submit(large(), priority=1, slo_ms=600_000).future.result(120)
        engine.submit(small(), priority=1, slo_ms=600_000).future.result(120)
        assert engine.drain(10) and engine.pool.num_used_pages == 0
        assert engine.executor.tiles.tiles_run == 16 + 1
        assert starts[0] == ("large", tail == "fifo")
        decoded = [(r.id, report.decode_s) for report in seen for r in report.decoded]
        if tail == "fifo":
            assert [rid for rid, _ in decoded] == ["large"] and decoded[0][1] > 0
            assert "small" in next(rep for rep in seen if rep.decoded).batch
        else:
            assert decoded == []
        engine.stop()
    pool = PagePool(512, PAGE)
    state = gen.encode(large(), pool)
    while not gen.is_done(state):
        gen.step([state])
    expected = stock_tiled_image(gen, state)
    for tail in ("fifo", "late"):
        np.testing.assert_array_equal(outputs[tail].output, expected)
    gen.release(state)
