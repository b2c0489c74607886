"""Replay a list of scheduler ``Request``s against an in-process engine in real time.

Each request is submitted at ``t0 + request.arrival`` with its workload deadline as
``slo_ms``; latency is measured from that scheduled arrival (so submission lag counts
against the engine, never for it). Returns the scheduler's ``Record``s, ready for
``ditmem.scheduler.metrics.summarize``.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import wait

from ditmem.models.common.request import GenerationRequest
from ditmem.scheduler import Request
from ditmem.scheduler.simulator import Record

PROMPTS = ("a lighthouse at dusk", "a red fox in fresh snow", "a bowl of ramen, studio light",
           "an astronaut reading in a library", "a watercolor harbor town")


def to_generation(request: Request) -> GenerationRequest:
    """The model-side request for a scheduler request (prompt from a fixed list)."""
    prompt = request.prompt or PROMPTS[(request.seed or 0) % len(PROMPTS)]
    return GenerationRequest(prompt=prompt, width=request.width, height=request.height,
                             num_inference_steps=request.steps, num_frames=request.frames,
                             seed=request.seed or 0, request_id=request.id)


def replay(engine, requests: list[Request], *, progress=None, timeout_s: float = 3600.0,
           timings: list | None = None):
    """Submit ``requests`` at their arrival times, wait for all; ``Record`` per request
    (times in seconds from the start of the replay), and the running seconds of each completed
    request. A failed or cancelled request gets ``finished = inf`` (a miss).
    ``progress``: optional tqdm-like bar (``update(1)``); ``timings``: a list that gets
    ``(request, Timing)`` of each completed request."""
    order = sorted(requests, key=lambda r: r.arrival)
    t0 = engine.clock()
    pending = {}
    for r in order:
        delay = t0 + r.arrival - engine.clock()
        if delay > 0:
            time.sleep(delay)
        slo_ms = 1000.0 * (r.deadline - r.arrival)
        ticket = engine.submit(to_generation(r), priority=r.priority, slo_ms=slo_ms,
                               arrival=t0 + r.arrival)
        if progress is not None:
            ticket.future.add_done_callback(lambda _f: progress.update(1))
        pending[r.id] = (r, ticket)
    wait([t.future for _, t in pending.values()], timeout=timeout_s)
    records, services = [], []
    for r, ticket in pending.values():
        fut = ticket.future
        if fut.done() and fut.exception() is None:
            timing = fut.result().timing
            records.append(Record(request=r, started=timing.started - t0,
                                  finished=timing.finished - t0,
                                  preemptions=timing.preemptions, offloads=timing.offloads))
            services.append(timing.running_s)
            if timings is not None:
                timings.append((r, timing))
        else:
            records.append(Record(request=r, started=math.inf, finished=math.inf,
                                  preemptions=0, offloads=0))
    return records, services
