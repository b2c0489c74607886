"""Named workloads (../shared/workloads/README.md) and arrival processes at a target load.

Load ρ = arrival rate × mean standalone time on the chosen cost model, so a workload is
always built against a CostModel. Arrivals are Poisson or ``gamma:CV`` (bursty: gamma
inter-arrival times with coefficient of variation CV; CV = 1 is Poisson). Seeded.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .cost import CostModel
from .omni_trace import OMNI_PREEMPT_TRACE
from .request import Request
from .traces import parse_trace


@dataclass(frozen=True, slots=True)
class Shape:
    width: int
    height: int
    frames: int
    steps: int
    share: float


@dataclass(frozen=True, slots=True)
class Mix:
    """A random mix: model, shapes with shares, priority shares (classes 0/1/2)."""

    model: str
    shapes: tuple[Shape, ...]
    priorities: tuple[float, float, float]


MIXES: dict[str, Mix] = {
    "seed-mix": Mix(
        "qwen-image",
        (Shape(512, 512, 1, 28, 0.6), Shape(1024, 1024, 1, 28, 0.3), Shape(2048, 2048, 1, 28, 0.1)),
        (0.2, 0.5, 0.3),
    ),
    "omni-mix": Mix(
        "qwen-image",
        (
            Shape(512, 512, 1, 20, 0.15),
            Shape(768, 768, 1, 20, 0.25),
            Shape(1024, 1024, 1, 25, 0.45),
            Shape(1536, 1536, 1, 35, 0.15),
        ),
        (0.0, 1.0, 0.0),
    ),
    "wan-mix": Mix(
        "wan2.2-a14b",
        (Shape(832, 480, 81, 40, 0.7), Shape(1280, 720, 81, 40, 0.3)),
        (0.2, 0.5, 0.3),
    ),
    "video-image-mix": Mix(
        "wan2.2-ti2v-5b",
        (
            Shape(1280, 704, 121, 50, 0.2),
            Shape(832, 480, 81, 50, 0.3),
            Shape(1024, 1024, 1, 50, 0.5),
        ),
        (0.2, 0.5, 0.3),
    ),
}
TRACES = {"omni-preempt": OMNI_PREEMPT_TRACE}
WORKLOADS = (*MIXES, *TRACES)
#: CPU scale: pixel dimensions divided by this (512² → 256², 1024² → 512², 2048² → 1024²).
CPU_SCALE_DIVISOR = 2


def parse_arrival(spec: str) -> float:
    """The CV of an arrival spec: ``poisson`` → 1.0, ``gamma:CV`` → CV (> 0)."""
    if spec == "poisson":
        return 1.0
    if spec.startswith("gamma:"):
        try:
            cv = float(spec.split(":", 1)[1])
        except ValueError:
            cv = -1.0
        if cv > 0:
            return cv
    raise ValueError(f"arrival must be 'poisson' or 'gamma:CV' with CV > 0, got {spec!r}")


def arrival_times(n: int, rate: float, cv: float, rng: random.Random) -> list[float]:
    """``n`` arrival times (s) of a renewal process with mean gap 1/rate and gap CV ``cv``."""
    if rate <= 0:
        raise ValueError(f"arrival rate must be > 0, got {rate}")
    shape = 1.0 / (cv * cv)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(shape, 1.0 / (rate * shape))
    return out


def _scaled(width: int, height: int, scale: str) -> tuple[int, int]:
    if scale == "gpu":
        return width, height
    if scale == "cpu":
        return width // CPU_SCALE_DIVISOR, height // CPU_SCALE_DIVISOR
    raise ValueError(f"scale must be 'gpu' or 'cpu', got {scale!r}")


def _from_mix(mix: Mix, n: int, rng: random.Random, scale: str) -> list[Request]:
    out = []
    shares = [s.share for s in mix.shapes]
    for i in range(n):
        shape = rng.choices(mix.shapes, weights=shares)[0]
        priority = rng.choices((0, 1, 2), weights=mix.priorities)[0]
        w, h = _scaled(shape.width, shape.height, scale)
        out.append(
            Request(f"r{i:05d}", 0.0, mix.model, w, h, shape.frames, shape.steps, priority, seed=i)
        )
    return out


def mean_standalone(name: str, cost: CostModel, scale: str = "gpu") -> float:
    """Expected standalone seconds of one request of the workload (exact, not sampled)."""
    if name in MIXES:
        mix = MIXES[name]
        total = 0.0
        for s in mix.shapes:
            w, h = _scaled(s.width, s.height, scale)
            total += s.share * cost.standalone_time(
                Request("m", 0.0, mix.model, w, h, s.frames, s.steps)
            )
        return total / sum(s.share for s in mix.shapes)
    requests = _trace_requests(name, scale)
    return sum(cost.standalone_time(r) for r in requests) / len(requests)


def _trace_requests(name: str, scale: str) -> list[Request]:
    trace = parse_trace(TRACES[name], name)
    for r in trace.requests:
        r.width, r.height = _scaled(r.width, r.height, scale)
    return trace.requests


def workload(
    name: str,
    cost: CostModel,
    *,
    load: float = 0.8,
    requests: int | None = None,
    seed: int = 0,
    arrival: str = "poisson",
    slo_scale: float = 3.0,
    scale: str = "gpu",
) -> list[Request]:
    """Requests of a named workload with arrivals at load ``load`` and deadlines assigned.

    ``requests`` defaults to 2,000 for random mixes and to the trace length for traces (a
    longer run repeats the trace in file order). ``scale="cpu"`` halves every pixel
    dimension (steps kept) for the tiny CPU models.
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    if load <= 0:
        raise ValueError(f"load must be > 0, got {load}")
    rng = random.Random(seed)
    if name in MIXES:
        out = _from_mix(MIXES[name], requests or 2000, rng, scale)
    else:
        base = _trace_requests(name, scale)
        n = requests or len(base)
        out = []
        for i in range(n):
            r = base[i % len(base)]
            rid = r.id if i < len(base) else f"{r.id}#{i // len(base)}"
            out.append(r.resubmitted(0.0, rid))
    rate = load / mean_standalone(name, cost, scale)
    times = arrival_times(len(out), rate, parse_arrival(arrival), rng)
    for r, t in zip(out, times, strict=True):
        r.arrival = t
        cost.assign_deadline(r, slo_scale)
    return out


def trace_load(requests: list[Request], cost: CostModel, devices: int = 1) -> float:
    """The load of a trace's own arrivals at ``cost``'s times: its arrival rate ((n − 1) /
    the span of its arrivals) × its mean standalone time ÷ ``devices``."""
    if len(requests) < 2:
        raise ValueError(f"a trace's load needs 2 requests or more, got {len(requests)}")
    times = sorted(r.arrival for r in requests)
    span = times[-1] - times[0]
    if span <= 0:
        raise ValueError("a trace's load needs arrivals spread over time, all arrive at once")
    mean = sum(cost.standalone_time(r) for r in requests) / len(requests)
    return (len(requests) - 1) / span * mean / devices


def at_load(
    requests: list[Request], cost: CostModel, load: float, *, devices: int = 1,
    slo_scale: float = 3.0,
) -> list[Request]:
    """Copies of ``requests`` with their arrival times scaled (about the first) so that the
    trace's own load (``trace_load``) is ``load`` exactly, deadlines assigned again.

    A renewal sample drawn at a rate arrives faster or slower than that rate: 150 Poisson
    arrivals by about 8 % (the demos' seed 0, drawn at ρ 0.8, arrive at 0.716). Scaling
    the gaps keeps their shape (Poisson: the same arrivals, given their count and span)
    and puts a short replay at the load it is named for."""
    if load <= 0:
        raise ValueError(f"load must be > 0, got {load}")
    factor = trace_load(requests, cost, devices) / load
    t0 = min(r.arrival for r in requests)
    return [cost.assign_deadline(r.resubmitted(t0 + (r.arrival - t0) * factor), slo_scale)
            for r in requests]


def with_load(
    requests: list[Request],
    cost: CostModel,
    load: float,
    *,
    seed: int = 0,
    arrival: str = "poisson",
    slo_scale: float = 3.0,
) -> list[Request]:
    """Copies of ``requests`` (e.g. a trace without timestamps) with generated arrivals."""
    rng = random.Random(seed)
    mean = sum(cost.standalone_time(r) for r in requests) / len(requests)
    times = arrival_times(len(requests), load / mean, parse_arrival(arrival), rng)
    out = []
    for r, t in zip(requests, times, strict=True):
        out.append(cost.assign_deadline(r.resubmitted(t), slo_scale))
    return out
