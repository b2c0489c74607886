"""Measuring the sequence-parallel speed-up of one request's step on this node: degree 1
vs degree d on the node engine's real workers, side by side.

For each image side, one request is encoded on device 0 and stepped alternately at degree
1 and at every other degree, re-sharded over the device link in between (not timed); each
round uses the next aligned group of each size (devices 0, 1, 0, ... at degree 1), so no
degree is tied to a core that other jobs happen to load more. A round is one step at each
degree; the speed-up is the median over rounds of (degree-1 time / degree-d time), both sides of a
round seeing the same machine load. Times are the slowest worker's wall time for the step
command (the engine's control round trip is excluded; it is measured as
``control_ms``). ``cpu_speedup`` is the same ratio on worker CPU time (largest rank): what
dedicated, otherwise idle cores would approach, when other jobs share the machine.
"""

from __future__ import annotations

import logging
import statistics
import time

from ditmem.models.request import GenerationRequest

log = logging.getLogger(__name__)

PROMPT = "a lighthouse on a cliff at dusk, oil painting"


def degrees_of(num_devices: int) -> list[int]:
    """Degrees measurable on ``num_devices`` devices: 1, 2, 4, ... up to it."""
    out, d = [], 1
    while d <= num_devices:
        out.append(d)
        d *= 2
    return out


def measure_speedups(node, sides: list[int], repeats: int, *, tokens_for=None,
                     progress=None) -> list[dict]:
    """Rows ``{"side", "tokens", "degree", "step_ms", "cpu_ms", "speedup", "cpu_speedup",
    "control_ms", "rounds"}`` for every side and degree on ``node`` (a ``NodeEngine``).
    ``tokens_for(side)`` names the token count (default: the model's image tokens,
    ``(side / 16) ** 2``)."""
    tokens_for = tokens_for or (lambda side: (side // 16) ** 2)
    degrees = degrees_of(node.num_devices)
    rows = []
    for side in sides:
        rid = f"speedup-{side}"
        request = GenerationRequest(PROMPT, width=side, height=side,
                                    num_inference_steps=2 * (repeats + 1) * len(degrees),
                                    guidance_scale=1.0, seed=side, request_id=rid)
        if not node.encode(request, 0):
            raise MemoryError(f"measure_speedups: device 0 has no room for a {side}^2 request")
        wall = {d: [] for d in degrees}
        cpu = {d: [] for d in degrees}
        control = []
        try:
            for r in range(repeats + 1):  # round 0 warms every degree up
                for d in degrees:
                    first = d * (r % (node.num_devices // d))  # rotate over the groups
                    group = tuple(range(first, first + d))
                    node.move(rid, group)
                    t0 = time.perf_counter()
                    (res,) = node.step([(group, [rid])])
                    took = time.perf_counter() - t0
                    if r:
                        wall[d].append(res.seconds)
                        cpu[d].append(res.cpu_seconds)
                        control.append(took - res.seconds)
                if progress:
                    progress(f"  {side}x{side} round {r}/{repeats}: " + ", ".join(
                        f"d{d} {1000 * wall[d][-1]:.1f} ms" for d in degrees if wall[d]))
        finally:
            node.release(rid)
        for d in degrees:
            ratios = [a / b for a, b in zip(wall[1], wall[d], strict=True)]
            cpu_ratios = [a / b for a, b in zip(cpu[1], cpu[d], strict=True)]
            rows.append({
                "side": side, "tokens": tokens_for(side), "degree": d,
                "step_ms": 1000 * statistics.median(wall[d]),
                "cpu_ms": 1000 * statistics.median(cpu[d]),
                "speedup": statistics.median(ratios),
                "cpu_speedup": statistics.median(cpu_ratios),
                "control_ms": 1000 * statistics.median(control), "rounds": repeats,
            })
    return rows


CLOCKS = {"cpu": "cpu_speedup", "wall": "speedup"}


def speedup_table(rows: list[dict], source: str, clock: str = "cpu") -> dict:
    """The profile's ``parallel`` entry of one model from :func:`measure_speedups` rows:
    ``{"tokens": [ascending], "speedup": {"1": [...], "2": [...]}, "source": source}``
    (degree 1 is exactly 1.0), on worker CPU time (``clock="cpu"``) or wall time."""
    if clock not in CLOCKS:
        raise ValueError(f"clock: expected one of {', '.join(CLOCKS)}, got {clock!r}")
    tokens = sorted({r["tokens"] for r in rows})
    degrees = sorted({r["degree"] for r in rows})
    by = {(r["tokens"], r["degree"]): r[CLOCKS[clock]] for r in rows}
    table = {str(d): [1.0 if d == 1 else round(by[(n, d)], 4) for n in tokens]
             for d in degrees}
    return {"tokens": tokens, "speedup": table, "source": source}
