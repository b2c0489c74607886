"""Measuring the sequence-parallel speed-up of one request's step on this node: degree 1
vs degree d on the node engine's real workers, side by side, and judging whether the
measurement can be trusted.

For each image side, one request is encoded on device 0 and stepped at every degree in
turn, re-sharded over the device link in between (not timed). A *round* runs ``steps``
consecutive steps at each degree (as a scheduled job does) on the next aligned group of
each size (devices 0, 1, 0, ... at degree 1, so no degree is tied to a core that other jobs
happen to load more); round 0 warms every degree and group up and is not kept. A round's
ratio is (degree-1 time / degree-d time), both sides of it seeing the same machine; the
speed-up is the median over rounds. Rounds go on past the minimum while that median is
pinned down worse than ``spread_limit`` (:func:`spread`: relative half-width of its ~90 %
confidence interval), up to ``max_rounds``.

Three clocks, all from the workers' replies: ``wall`` (slowest rank's wall time for the
step commands), ``cpu`` (largest rank's main-thread CPU time: the thread running the model
with one torch thread; busy time, without waits for a core or a peer) and ``process``
(largest rank's CPU time of every thread, the collective backend's copies included).

:func:`check_speedups` is the plausibility rule a table must pass before a scheduler plans
with it; :func:`calibrate` measures, checks, measures again once when the check fails, and
refuses (``CalibrationError``) when the second measurement fails too, saying why in the log.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from concurrent.futures import wait

from ditmem.models.common.request import GenerationRequest
from ditmem.parallel import commands as cmd

log = logging.getLogger(__name__)

PROMPT = "a lighthouse on a cliff at dusk, oil painting"

#: the median of one (size, degree)'s per-round ratios must be pinned down this well:
#: half-width of its confidence interval / median (:func:`spread`). 20 %: on this 2-core
#: machine at load ~1, two measurements in a row put 1024 tokens at x1.38 +-14 % each, and
#: 10 % refused a table they agreed on; a table off by 20 % still plans the right degrees.
SPREAD_LIMIT = 0.20
#: at the largest size, the ranks of a degree-d step may together use this many times the
#: degree-1 step's CPU time (busy-time clocks only): more means they ran slower per unit
#: of work than degree 1 did (a core shared with another job, a hyperthread sibling, a
#: peer spinning while it waits), not that the model's work failed to split
WORK_INFLATION_LIMIT = 1.35
#: at the largest size, the ranks of a degree-d step hold equal shares (within one row),
#: so their CPU times may differ by this factor, no more: beyond it one core was slower
#: (another job on it) and the slowest rank set the measured step
IMBALANCE_LIMIT = 1.3
#: at the largest size, a busy-time speed-up may exceed the wall-time one by this factor:
#: beyond it the ranks waited for a core (or a peer) for much of the step — degree d needs
#: d cores at once, so another runnable job stalls it at every exchange while degree 1
#: keeps its core — and the replay, which runs on wall time, will not see the table
WALL_GAP_LIMIT = 1.25
#: a speed-up may exceed the degree by this factor (timing noise), no more
SUPERLINEAR_SLACK = 1.05

CLOCKS = {"cpu": "cpu_speedup", "process": "process_speedup", "wall": "speedup"}
_REPLY_CLOCK = {"wall": "seconds", "cpu": "cpu_seconds", "process": "process_cpu_seconds"}


class CalibrationError(RuntimeError):
    """The speed-up measurement stayed implausible after measuring again; ``waited_only``:
    the last one failed only the wall-gap rule (on a busy-time clock the ranks waited for
    cores: a wall-time table would describe what a replay sees now)."""

    def __init__(self, message: str, waited_only: bool = False) -> None:
        super().__init__(message)
        self.waited_only = waited_only


def degrees_of(num_devices: int) -> list[int]:
    """Degrees measurable on ``num_devices`` devices: 1, 2, 4, ... up to it."""
    out, d = [], 1
    while d <= num_devices:
        out.append(d)
        d *= 2
    return out


def spread(values: list[float]) -> float:
    """How well ``values`` pin their median down: the half-width of a distribution-free
    confidence interval of the median (order statistics ``x_(k)`` .. ``x_(n+1-k)``, ``k``
    the largest with P(Binomial(n, 1/2) < k) <= 5 %, so >= 90 % coverage from 5 values on;
    ``k = 1``, the range, below that), relative to the median. 0.0 for fewer than two."""
    n = len(values)
    if n < 2:
        return 0.0
    k, below = 1, 0.5 ** n  # below = P(B < k + 1) for the candidate k + 1
    while k + 1 <= n // 2 and below + math.comb(n, k) * 0.5 ** n <= 0.05:
        below += math.comb(n, k) * 0.5 ** n
        k += 1
    xs = sorted(values)
    med = statistics.median(xs)
    return (xs[n - k] - xs[k - 1]) / 2 / med if med > 0 else float("inf")


def _steps(node, rid: str, group: tuple[int, ...], steps: int) -> dict[str, float]:
    """Run ``steps`` steps of ``rid`` on ``group``; per clock, the slowest rank's total
    (``wall``, ``cpu``, ``process``), every rank's total CPU time (``cpu_sum``) and the
    engine's control overhead per step (``control``)."""
    totals = {d: {"seconds": 0.0, "cpu_seconds": 0.0, "process_cpu_seconds": 0.0}
              for d in group}
    control = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        futures = node.submit({d: cmd.Step([rid], group) for d in group})
        wait(list(futures.values()), timeout=node.command_timeout_s)
        took = time.perf_counter() - t0
        replies = {d: f.result(timeout=0) for d, f in futures.items()}
        bad = {d: r.error for d, r in replies.items() if not r.ok}
        if bad:
            raise RuntimeError(f"measure_speedups: step of {rid} on {group} failed: {bad}")
        for d, r in replies.items():
            for key in totals[d]:
                totals[d][key] += getattr(r, key)
        control += took - max(r.seconds for r in replies.values())
    out = {clock: max(t[key] for t in totals.values()) for clock, key in _REPLY_CLOCK.items()}
    out["cpu_sum"] = sum(t["cpu_seconds"] for t in totals.values())
    out["cpu_min"] = min(t["cpu_seconds"] for t in totals.values())
    out["control"] = control / steps
    return out


def _ratios(samples: dict[int, list[dict]], degree: int, clock: str) -> list[float]:
    return [a[clock] / b[clock] for a, b in zip(samples[1], samples[degree], strict=True)]


def measure_speedups(node, sides: list[int], rounds: int, *, steps: int = 2,
                     max_rounds: int | None = None, clock: str = "cpu",
                     spread_limit: float = SPREAD_LIMIT, tokens_for=None, frames: int = 1,
                     progress=None) -> list[dict]:
    """Rows for every side and degree on ``node`` (a ``NodeEngine``):
    ``{"side", "tokens", "degree", "step_ms", "cpu_ms", "process_ms" (medians of one
    step), "speedup", "cpu_speedup", "process_speedup" (wall / cpu / process clocks),
    "spread" (:func:`spread` of ``clock``'s per-round ratios), "work_inflation" (every
    rank's CPU time / degree 1's, median), "imbalance" (largest / smallest rank CPU time,
    median), "control_ms", "rounds", "ratios" (``clock``'s
    per-round ratios)}``. At least ``rounds`` rounds per side; more while the spread is
    above ``spread_limit``, up to ``max_rounds`` (default ``3 * rounds``).
    ``tokens_for(side)`` names the token count (default ``(side / 16) ** 2``); ``frames``:
    of each request (video models)."""
    if clock not in CLOCKS:
        raise ValueError(f"clock: expected one of {', '.join(CLOCKS)}, got {clock!r}")
    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds and steps must be >= 1, got {rounds}, {steps}")
    max_rounds = max(rounds, 3 * rounds if max_rounds is None else max_rounds)
    tokens_for = tokens_for or (lambda side: (side // 16) ** 2)
    degrees = degrees_of(node.num_devices)
    rows = []
    for side in sides:
        rid = f"speedup-{side}"
        request = GenerationRequest(PROMPT, width=side, height=side, num_frames=frames,
                                    num_inference_steps=steps * (max_rounds + 1) * len(degrees),
                                    guidance_scale=1.0, seed=side, request_id=rid)
        if not node.encode(request, 0):
            raise MemoryError(f"measure_speedups: device 0 has no room for a {side}^2 request")
        samples: dict[int, list[dict]] = {d: [] for d in degrees}
        try:
            r = 0
            while True:  # round 0 warms every degree up
                for d in degrees:
                    first = d * (r % (node.num_devices // d))  # rotate over the groups
                    group = tuple(range(first, first + d))
                    node.move(rid, group)
                    sample = _steps(node, rid, group, steps)
                    if r:
                        samples[d].append(sample)
                if progress and r:
                    progress(f"  {side}x{side} round {r}: " + ", ".join(
                        f"d{d} {1000 * samples[d][-1]['wall'] / steps:.1f} ms"
                        for d in degrees))
                worst = max((spread(_ratios(samples, d, clock)) for d in degrees[1:]),
                            default=0.0) if r else float("inf")
                if r >= max_rounds or (r >= rounds and worst <= spread_limit):
                    break
                r += 1
        finally:
            node.release(rid)
        base_cpu = [s["cpu"] for s in samples[1]]
        for d in degrees:
            mine = samples[d]
            ratios = _ratios(samples, d, clock)
            rows.append({
                "side": side, "tokens": tokens_for(side), "degree": d,
                "step_ms": 1000 * statistics.median(s["wall"] for s in mine) / steps,
                "cpu_ms": 1000 * statistics.median(s["cpu"] for s in mine) / steps,
                "process_ms": 1000 * statistics.median(s["process"] for s in mine) / steps,
                "speedup": statistics.median(_ratios(samples, d, "wall")),
                "cpu_speedup": statistics.median(_ratios(samples, d, "cpu")),
                "process_speedup": statistics.median(_ratios(samples, d, "process")),
                "spread": spread(ratios),
                "work_inflation": statistics.median(
                    s["cpu_sum"] / b for s, b in zip(mine, base_cpu, strict=True)),
                "imbalance": statistics.median(s["cpu"] / s["cpu_min"] for s in mine),
                "control_ms": 1000 * statistics.median(s["control"] for s in mine),
                "rounds": len(mine), "ratios": [round(x, 4) for x in ratios],
            })
    return rows


def check_speedups(rows: list[dict], clock: str = "cpu", *,
                   spread_limit: float = SPREAD_LIMIT,
                   inflation_limit: float = WORK_INFLATION_LIMIT,
                   imbalance_limit: float = IMBALANCE_LIMIT,
                   wall_gap_limit: float = WALL_GAP_LIMIT) -> list[str]:
    """What makes rows of :func:`measure_speedups` implausible on ``clock`` (empty: none):

    * a degree slower than degree 1 at the largest size (the split share of a step grows
      with tokens; at the largest size every earlier measurement here gained);
    * a speed-up above the degree (beyond ``SUPERLINEAR_SLACK``);
    * a median pinned down worse than ``spread_limit`` (:func:`spread`);
    * on the busy-time clocks (cpu, process), the ranks of a step at the largest size
      together using more than ``inflation_limit`` × degree 1's CPU time for the same
      work: they ran slower per unit of work, so the table measures the machine's
      contention at that moment, not the split;
    * at the largest size, one rank using more than ``imbalance_limit`` × another's CPU
      time for its equal share (one core was slower; the step waited for it);
    * on the busy-time clocks, at the largest size, a speed-up above ``wall_gap_limit`` ×
      the wall-time one (the ranks waited for cores the replay will not have either).
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock: expected one of {', '.join(CLOCKS)}, got {clock!r}")
    problems = []
    largest = max((r["tokens"] for r in rows), default=None)
    for r in sorted(rows, key=lambda r: (r["tokens"], r["degree"])):
        d, s = r["degree"], r[CLOCKS[clock]]
        if d == 1:
            continue
        where = f"degree {d} at {r['tokens']} tokens"
        if r["tokens"] == largest and s < 1.0:
            problems.append(f"{where}: x{s:.2f}, slower than degree 1 at the largest size")
        if s > d * SUPERLINEAR_SLACK:
            problems.append(f"{where}: x{s:.2f}, above the degree")
        if r["spread"] > spread_limit:
            problems.append(f"{where}: median uncertain by +-{100 * r['spread']:.0f} % "
                            f"(limit {100 * spread_limit:.0f} %) after {r['rounds']} rounds")
        if (clock != "wall" and r["tokens"] == largest
                and r["work_inflation"] > inflation_limit):
            problems.append(f"{where}: the ranks used {r['work_inflation']:.2f} x degree 1's "
                            f"CPU time for the same step (limit {inflation_limit:.2f}): they "
                            "ran slower per unit of work (contention), not a split that "
                            "fails")
        if clock != "wall" and r["tokens"] == largest and s > wall_gap_limit * r["speedup"]:
            problems.append(f"{where}: x{s:.2f} on {clock} time but x{r['speedup']:.2f} on "
                            f"wall time (limit {wall_gap_limit:.2f} x): the ranks waited for "
                            "a core for much of the step (another job runs); the replay would "
                            "not see this table (quiet machine, or --parallel-clock wall)")
        if r["tokens"] == largest and r.get("imbalance", 1.0) > imbalance_limit:
            problems.append(f"{where}: one rank used {r['imbalance']:.2f} x the other's CPU "
                            f"time for an equal share (limit {imbalance_limit:.2f}): one core "
                            "was slower")
    return problems


def describe(rows: list[dict], clock: str = "cpu") -> list[str]:
    """One line per (side, degree > 1): speed-up on every clock, spread, rounds."""
    return [f"  {r['side']}x{r['side']} ({r['tokens']} tokens) degree {r['degree']}: "
            f"x{r[CLOCKS[clock]]:.2f} on {clock} time +-{100 * r['spread']:.0f} % "
            f"({r['rounds']} rounds; cpu x{r['cpu_speedup']:.2f}, process "
            f"x{r['process_speedup']:.2f}, wall x{r['speedup']:.2f}; "
            f"{r['step_ms']:.1f} ms wall per step, ranks' work x{r['work_inflation']:.2f}, "
            f"rank imbalance x{r['imbalance']:.2f})"
            for r in rows if r["degree"] > 1]


def calibrate(node, sides: list[int], rounds: int, *, clock: str = "cpu", attempts: int = 2,
              report=None, **kwargs) -> list[dict]:
    """:func:`measure_speedups`, checked with :func:`check_speedups`; an implausible
    measurement is reported (``report``, default this module's logger at WARNING) and made
    again, up to ``attempts`` times in all; ``CalibrationError`` (with every problem) when
    the last one fails too."""
    report = report or log.warning
    problems: list[str] = []
    for attempt in range(1, attempts + 1):
        rows = measure_speedups(node, sides, rounds, clock=clock, **kwargs)
        for line in describe(rows, clock):
            report(line)
        problems = check_speedups(rows, clock,
                                  spread_limit=kwargs.get("spread_limit", SPREAD_LIMIT))
        if not problems:
            return rows
        report(f"speed-up measurement {attempt}/{attempts} is implausible: "
               + "; ".join(problems)
               + ("; measuring again" if attempt < attempts else "; refusing it"))
    waited_only = not check_speedups(rows, clock, wall_gap_limit=math.inf,
                                     spread_limit=kwargs.get("spread_limit", SPREAD_LIMIT))
    raise CalibrationError("the speed-up table stayed implausible after "
                           f"{attempts} measurements: " + "; ".join(problems), waited_only)


def speedup_table(rows: list[dict], source: str, clock: str = "cpu") -> dict:
    """The profile's ``parallel`` entry of one model from :func:`measure_speedups` rows:
    ``{"tokens": [ascending], "speedup": {"1": [...], "2": [...]}, "source": source}``
    (degree 1 is exactly 1.0) on ``clock`` ("cpu", "process" or "wall"), plus
    ``"spread"`` (per degree and token count, the per-round ratios' relative spread) when
    the rows have it."""
    if clock not in CLOCKS:
        raise ValueError(f"clock: expected one of {', '.join(CLOCKS)}, got {clock!r}")
    tokens = sorted({r["tokens"] for r in rows})
    degrees = sorted({r["degree"] for r in rows})
    by = {(r["tokens"], r["degree"]): r for r in rows}
    table = {str(d): [1.0 if d == 1 else round(by[(n, d)][CLOCKS[clock]], 4) for n in tokens]
             for d in degrees}
    out = {"tokens": tokens, "speedup": table, "source": source}
    if all("spread" in r for r in rows):
        out["spread"] = {str(d): [0.0 if d == 1 else round(by[(n, d)]["spread"], 4)
                                  for n in tokens] for d in degrees}
    return out
