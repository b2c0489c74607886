"""A parked request handed from one engine to another (ditmem.engine.handoff) ends with the
final latents and the image of an uninterrupted run on one engine, bit for bit (tolerance
0): the adopter runs the same steps, alone in its batch as the reference was, on the same
bytes (the pages are copied verbatim, the solver state and schedule travel with them), so
no rounding can differ. The latents are what is compared first: the tiny Qwen-Image VAE's
seeded random weights decode every latent to the same picture (seed 11 and 12, 6 and 8
steps: identical pixels), so equal images alone would prove nothing. Each engine has its
own generator (loaded separately, seeded weights) and its own pools; no page may be left
in use on either after the run. A tiny Wan video (row-shaped cross-attention K/V pages,
UniPC history) moves the same way. Bad blobs are refused with a clear error and change
nothing."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from ditmem import models
from ditmem.engine.factory import make_policy_and_cost
from ditmem.engine.handoff import (
    BadBlob,
    HandoffRefused,
    RequestMoved,
    adopt_blob,
    export_parked,
)
from ditmem.engine.loop import Engine
from ditmem.memory import HostPool, PagePool
from ditmem.models.common.request import GenerationRequest
from ditmem.scheduler import Location

PAGE = 4096
STEPS = 8


@pytest.fixture(scope="module")
def gens():
    """Two separately loaded generators whose decodes record the final latents."""
    out = []
    for _ in range(2):
        gen = models.load("tiny-qwen-image")
        gen.finals = {}
        decode = gen.decode

        def recording(state, gen=gen, decode=decode):
            gen.finals[state.request_id] = state.get("latents").clone()
            return decode(state)

        gen.decode = recording
        out.append(gen)
    return tuple(out)


def make_engine(gen, pages=256, page=PAGE, host_pages=None):
    policy, cost = make_policy_and_cost("slo", "cpu-tiny")
    host = HostPool(4 * pages if host_pages is None else host_pages, page)
    return Engine(gen, policy, cost, PagePool(pages, page), host)


def request(rid="r"):
    return GenerationRequest(prompt="a lighthouse at dusk", width=64, height=64,
                             num_inference_steps=STEPS, seed=11, request_id=rid)


@pytest.fixture(scope="module")
def uninterrupted(gens):
    """(final latents, image) of the request run alone, start to end, on one engine."""
    engine = make_engine(gens[0]).start()
    result = engine.submit(request(), priority=1, slo_ms=600_000).future.result(300)
    assert engine.drain(10)
    other = make_engine(gens[0]).start()  # the comparison can tell runs apart
    other.submit(dataclasses.replace(request("s"), seed=12), slo_ms=600_000).future.result(300)
    assert other.drain(10)
    assert not torch.equal(gens[0].finals["s"], gens[0].finals["r"])
    return gens[0].finals["r"], result.output


def assert_same_run(gen, result, uninterrupted):
    latents, image = uninterrupted
    assert torch.equal(gen.finals[result.request_id], latents)
    np.testing.assert_array_equal(result.output, image)


def run_to_step(engine, k):
    """Drive the engine's iterations on this thread until the request did ``k`` steps."""
    ticket = engine.submit(request(), priority=1, slo_ms=600_000)
    for _ in range(10 * k + 10):
        job = engine.executor.active.get("r")
        if job is not None and job.status.steps_done >= k:
            break
        engine.executor.iterate()
    assert job.status.steps_done == k
    return ticket


def assert_no_pages(engine):
    assert engine.pool.num_used_pages == 0, engine.pool.num_used_pages
    assert engine.host.num_used_pages == 0, engine.host.num_used_pages


@pytest.mark.parametrize("k, offloaded", [(3, True), (1, False)])
def test_handed_off_request_equals_uninterrupted_run(gens, uninterrupted, k, offloaded):
    a, b = make_engine(gens[0]), make_engine(gens[1])
    ticket_a = run_to_step(a, k)
    job = a.executor.active["r"]
    if offloaded:  # parked on the host, as a preemption leaves it
        handle = a.executor.stages.start_offload(job)
        a.executor.stages.finish_offload(job, handle)
        job.status.location = Location.HOST
    arrival, deadline = job.sched.arrival, job.sched.deadline
    blob = export_parked(a, "r")
    assert blob.steps_done == k and blob.num_pages > 0
    assert blob.nbytes == sum(t.nbytes for t in blob.tensors)
    with pytest.raises(RequestMoved, match=f"after {k} of {STEPS}"):
        ticket_a.future.result(0)
    assert_no_pages(a)
    assert a.stats().running == 0 and not a.executor.active and not a.intake.live
    assert abs(blob.age_s - (a.clock() - arrival)) < 5
    assert abs(blob.deadline_in_s - (deadline - a.clock())) < 5

    ticket_b = adopt_blob(b, blob)
    assert b.progress("r") == pytest.approx(k / STEPS)
    assert b.status("r") == "in_progress"
    assert b.executor.active["r"].status.location is Location.HOST
    # the deadline window is the original one, the clocks' origins aside
    sched = b.executor.active["r"].sched
    assert sched.deadline - sched.arrival == pytest.approx(deadline - arrival, abs=1e-6)
    b.start()
    result = ticket_b.future.result(300)
    assert b.drain(10)
    assert result.timing.steps_run == STEPS  # k on A, the rest on B
    assert result.timing.offloads >= (0 if offloaded else 1)  # the export's own offload
    assert_no_pages(b)
    assert_same_run(gens[1], result, uninterrupted)


def test_threaded_export_and_adopt(gens, uninterrupted):
    """Through ``engine.handoff`` while both engines run: the export happens whenever the
    engine thread gets to it (between iterations), at whatever step the request is."""
    a, b = make_engine(gens[0]).start(), make_engine(gens[1]).start()
    ticket_a = a.submit(request(), priority=1, slo_ms=600_000)
    deadline = time.monotonic() + 120
    while (a.progress("r") or 0) < 1 / STEPS:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.002)
    try:
        blob = a.handoff.export("r", source="a")
    except HandoffRefused:  # it finished first: nothing to hand off
        pytest.skip("the request finished before the export ran")
    with pytest.raises(RequestMoved):
        ticket_a.future.result(0)
    assert a.handoff.exported == 1 and blob.source == "a"
    ticket_b = b.handoff.adopt(blob)
    result = ticket_b.future.result(300)
    assert a.drain(10) and b.drain(10)
    assert b.handoff.adopted == 1
    assert_no_pages(a)
    assert_no_pages(b)
    assert_same_run(gens[1], result, uninterrupted)


def test_export_refuses_what_is_not_parked(gens):
    a = make_engine(gens[0])
    with pytest.raises(HandoffRefused, match="not a parked request"):
        export_parked(a, "nobody")
    a.submit(request(), priority=1, slo_ms=600_000)  # queued, never started
    with pytest.raises(HandoffRefused, match="queued"):
        export_parked(a, "r")
    with pytest.raises(HandoffRefused, match="the engine is not started"):
        a.handoff.export("r")


@pytest.fixture(scope="module")
def blob(gens):
    a = make_engine(gens[0])
    run_to_step(a, 2)
    return export_parked(a, "r")


@pytest.mark.parametrize("change, error", [
    (dict(generator="tiny-wan"), "model: the blob is a tiny-wan"),
    (dict(model="wan2.2-a14b"), "model:"),
    (dict(dtype="bfloat16"), "model:"),
    (dict(version=99), "version: blob layout 99"),
    (dict(steps_done=STEPS), "steps_done"),
    ("truncate", r"data: \d+ bytes, the layout needs \d+ \(truncated\?\)"),
    ("flip", "digest does not match"),
    ("pages", "claims"),
])
def test_bad_blobs_are_refused(gens, blob, change, error):
    b = make_engine(gens[1])
    if change == "truncate":
        bad = dataclasses.replace(blob, data=blob.data[:-100])
    elif change == "flip":
        data = blob.data.copy()
        data[len(data) // 2] ^= 0xFF
        bad = dataclasses.replace(blob, data=data)
    elif change == "pages":
        tensors = [dataclasses.replace(t, pages=t.pages + 1) for t in blob.tensors]
        bad = dataclasses.replace(blob, tensors=tensors)
    else:
        bad = dataclasses.replace(blob, **change)
    with pytest.raises(BadBlob, match=error):
        adopt_blob(b, bad)
    assert_no_pages(b)
    assert not b.executor.active and not b.intake.live


def test_other_page_size_is_refused(gens, blob):
    b = make_engine(gens[1], page=2 * PAGE)
    with pytest.raises(BadBlob, match="page_bytes: the blob's pages are 4096 bytes"):
        adopt_blob(b, blob)
    assert_no_pages(b)


def test_adopt_refuses_without_room_or_twice(gens, blob):
    small = make_engine(gens[1], host_pages=blob.num_pages - 1)
    with pytest.raises(HandoffRefused, match="host pages"):
        adopt_blob(small, blob)
    assert_no_pages(small)
    b = make_engine(gens[1])
    ticket = adopt_blob(b, blob)
    with pytest.raises(HandoffRefused, match="already live"):
        adopt_blob(b, blob)
    assert b.host.num_used_pages == blob.num_pages
    b.cancel("r")
    b.executor.take_intake()
    assert ticket.future.exception(0) is not None
    assert_no_pages(b)


def test_a_wan_video_handed_off_equals_an_uninterrupted_run():
    """Wan's state has row-shaped tensors (cross-attention K/V pages of [heads, head_dim]
    rows) and UniPC history; both must travel as they are."""
    from test_engine_wan import wan_profile

    from ditmem.engine.factory import EngineConfig, build_engine

    config = EngineConfig(model="tiny-wan", policy="slo", pool_mb=16, page_kb=16)
    gen_a, gen_b = models.load("tiny-wan"), models.load("tiny-wan")
    finals = {}
    for gen in (gen_a, gen_b):
        def recording(state, decode=gen.decode, gen=gen):
            finals[(id(gen), state.request_id)] = state.get("latents").clone()
            return decode(state)

        gen.decode = recording
    video = GenerationRequest(prompt="waves", width=32, height=32, num_frames=5,
                              num_inference_steps=4, seed=3, request_id="v")
    alone = build_engine(config, generator=gen_a, cost=wan_profile()).start()
    expected = alone.submit(dataclasses.replace(video), slo_ms=600_000).future.result(300)
    assert alone.drain(30)
    a = build_engine(config, generator=gen_a, cost=wan_profile())
    b = build_engine(config, generator=gen_b, cost=wan_profile())
    a.submit(dataclasses.replace(video), slo_ms=600_000)
    for _ in range(20):
        job = a.executor.active.get("v")
        if job is not None and job.status.steps_done >= 2:
            break
        a.executor.iterate()
    blob = export_parked(a, "v")
    assert blob.steps_done == 2
    assert any(t.row_shape for t in blob.tensors), [t.row_shape for t in blob.tensors]
    assert_no_pages(a)
    ticket = adopt_blob(b, blob)
    b.start()
    result = ticket.future.result(300)
    assert b.drain(30)
    assert_no_pages(b)
    assert torch.equal(finals[(id(gen_b), "v")], finals[(id(gen_a), "v")])
    np.testing.assert_array_equal(result.output, expected.output)
