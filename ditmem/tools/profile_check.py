"""How well a real run matched the profile it was planned with.

A demo builds its trace's arrivals and deadlines from the profile it measured at start;
when the run's ops take longer or shorter than the profile says, the trace ran at another
load than the one asked for, and the simulator's prediction and the printed limits describe
another run. :class:`ProfileCheck` keeps, per kind of work (``steps`` — by degree on a node —
``encodes``, ``decodes``, ``moves``), the seconds measured in the run beside the seconds the
profile predicts for the same work; :func:`report` turns that into the lines a demo prints,
with the load the run's work implies beside the requested one, and logs a warning for every
kind off by more than ``LIMIT``.

Both demos feed it: the one-device demo from the engine's step reports and each request's
``Timing`` (:func:`observe_step_report`, :func:`observe_timing`), the node demo from its
jobs' ``Timings`` (``ditmem.tools.node_demo.TrackedDevices``).
"""

from __future__ import annotations

import logging

log = logging.getLogger("ditmem.profile")

#: in-run time off the profile by more than this fraction (either way: ratio > 1 + LIMIT or
#: < 1 / (1 + LIMIT)) is warned about
LIMIT = 0.10


class ProfileCheck:
    """Per kind: in-run measured seconds and the profile's predicted seconds, summed."""

    def __init__(self) -> None:
        self.measured: dict[str, float] = {}
        self.predicted: dict[str, float] = {}
        self.jobs: dict[str, int] = {}

    def add(self, kind: str, measured: float, predicted: float) -> None:
        """One piece of work of ``kind``: ``measured`` seconds in the run, ``predicted`` by
        the profile."""
        self.measured[kind] = self.measured.get(kind, 0.0) + measured
        self.predicted[kind] = self.predicted.get(kind, 0.0) + predicted
        self.jobs[kind] = self.jobs.get(kind, 0) + 1

    def summary(self) -> dict[str, dict]:
        """Per kind: ``{"measured_s", "predicted_s", "ratio", "jobs"}`` (sums over jobs;
        ``ratio`` = measured / predicted, inf where nothing was predicted)."""
        return {k: {"measured_s": self.measured[k], "predicted_s": self.predicted[k],
                    "ratio": self.measured[k] / self.predicted[k] if self.predicted[k] > 0
                    else float("inf"), "jobs": self.jobs[k]}
                for k in sorted(self.measured)}


def work_ratio(summary: dict[str, dict]) -> float:
    """All kinds together: measured seconds / predicted seconds (1.0 when empty)."""
    predicted = sum(v["predicted_s"] for v in summary.values())
    measured = sum(v["measured_s"] for v in summary.values())
    return measured / predicted if predicted > 0 else 1.0


def is_off(ratio: float, limit: float = LIMIT) -> bool:
    """Whether ``ratio`` (measured / profile) is off by more than ``limit`` either way."""
    return not 1 / (1 + limit) <= ratio <= 1 + limit


def report(name: str, summary: dict[str, dict], requested_load: float,
           measured_load: float | None = None, limit: float = LIMIT,
           trace_load: float | None = None) -> list[str]:
    """The lines a demo prints for policy ``name``: each kind's ratio, the load the run's
    work implies (the trace's load at the profile's times x :func:`work_ratio`) or, when
    given, the run's own ``measured_load``, beside the requested one; and, for everything off
    by more than ``limit``, a line starting "[off]" that is also logged as a warning.

    ``trace_load``: the load of the trace's own arrivals at the profile's times (its arrival
    rate x its mean standalone time). A finite Poisson sample arrives faster or slower than
    the rate it was drawn at (150 requests: ~8 %), and that is no fault of the profile: the
    simulator and the limits see the same arrivals. So the run's load is held against it
    when given, else against ``requested_load``."""
    expected = requested_load if trace_load is None else trace_load
    implied = expected * work_ratio(summary)
    load = implied if measured_load is None else measured_load
    parts = ", ".join(f"{k} x{v['ratio']:.2f}" for k, v in summary.items())
    lines = [f"  {name:<6} {parts or 'nothing measured'}; load {load:.2f} "
             f"(requested {requested_load:.2f}"
             + ("" if trace_load is None else f"; these arrivals at the profile's times "
                                              f"{trace_load:.2f}")
             + ("" if measured_load is None else f"; the work alone implies {implied:.2f}")
             + ")"]
    off = [f"[off] {name} {k}: x{v['ratio']:.2f} of the profile over {v['jobs']} jobs"
           for k, v in summary.items() if is_off(v["ratio"], limit)]
    if is_off(load / expected, limit):
        off.append(f"[off] {name}: the trace ran at load {load:.2f}, not the "
                   + ("requested" if trace_load is None else "profile's") + f" {expected:.2f}")
    if off:
        log.warning("%s ran off its start-up profile: %s -- the simulator's prediction and "
                    "the trace's limits assume the profile (x1.00)", name,
                    "; ".join(line.split(" ", 2)[2] for line in off))
    return lines + [f"  {line}" for line in off]


def observe_step_report(check: ProfileCheck, report, cost) -> None:
    """Add one engine ``StepReport``'s denoising step and transfers to ``check``, beside
    ``cost`` (a ``CostModel`` of the profile as measured, without online corrections).
    Encodes and decodes come per request from their ``Timing`` (:func:`observe_timing`):
    tiled decodes run outside step reports."""
    if report.batch and report.step_s > 0:
        full = cost.step_time(report.model, report.tokens)
        share = 1.0 if report.blocks is None else report.blocks / cost.blocks(report.model)
        check.add("steps", report.step_s, full * share)
    if report.transfer_bytes > 0:
        check.add("moves", report.transfer_s, cost.transfer_time(report.transfer_bytes))


def observe_timing(check: ProfileCheck, request, timing, cost) -> None:
    """Add a completed request's encode and decode seconds (``Timing``) to ``check``."""
    check.add("encodes", timing.encode_s, cost.encode_time(request))
    check.add("decodes", timing.decode_s, cost.decode_time(request))
