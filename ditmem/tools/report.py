"""Summaries and the side-by-side table of a real (served or in-process) run.

Metric fields come from ``ditmem.scheduler.metrics.summarize`` (the same as ``ditmem sim``);
this adds what only a real run knows: wall time, the measured load, engine counters, and
pages left in the pool after draining (must be 0).
"""

from __future__ import annotations

import math


def run_summary(records, services, stats, wall_s: float, pages_leaked: int | None = None) -> dict:
    """``summarize(records)`` plus ``latencies_s``, ``wall_s``, ``measured_load`` (arrival
    rate × mean running seconds of a completed request), engine counters and leaks."""
    from ditmem.scheduler.metrics import summarize

    out = summarize(records)
    arrivals = sorted(r.request.arrival for r in records)
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    rate = (len(arrivals) - 1) / span if span > 0 else math.nan
    out["latencies_s"] = [r.latency for r in records]
    out["per_request"] = request_rows(records)
    out["wall_s"] = wall_s
    out["arrival_rate_per_s"] = rate
    out["mean_service_s"] = sum(services) / len(services) if services else math.nan
    out["measured_load"] = rate * out["mean_service_s"]
    out["completed"] = stats.completed
    out["failed"] = stats.failed + stats.cancelled
    out["preemptions_total"] = stats.preemptions
    out["bytes_offloaded"] = stats.bytes_offloaded
    out["steps"] = stats.steps
    out["iterations"] = stats.iterations
    out["schedule_s"] = stats.schedule_s
    if pages_leaked is not None:
        out["pages_leaked"] = pages_leaked
    return out


def request_rows(records) -> list[dict]:
    """One row per request, in arrival order, for diagnosing a run after the fact: ``id``,
    ``shape`` ("WxH"), ``steps``, ``priority``, ``arrival_s``, ``started_s``, ``finished_s``,
    ``deadline_s`` (seconds on the run's clock), ``latency_s``, ``preemptions``,
    ``offloads``, ``met``."""
    rows = []
    for r in sorted(records, key=lambda r: (r.request.arrival, r.request.id)):
        q = r.request
        rows.append({"id": q.id, "shape": f"{q.width}x{q.height}", "steps": q.steps,
                     "priority": q.priority, "arrival_s": q.arrival, "started_s": r.started,
                     "finished_s": r.finished, "deadline_s": q.deadline,
                     "latency_s": r.latency, "preemptions": r.preemptions,
                     "offloads": r.offloads, "met": r.met})
    return rows


def _fmt(v, pct=False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:.3f}"


def comparison_table(results: dict, meta: dict) -> str:
    """A plain-text table, one column per policy; ratios against the first policy."""
    names = list(results)
    rows = [("SLO attainment", "slo_attainment", True), ("P50 latency (s)", "p50_s", False),
            ("P95 latency (s)", "p95_s", False), ("P99 latency (s)", "p99_s", False),
            ("mean latency (s)", "mean_s", False), ("measured load", "measured_load", False),
            ("preemptions/request", "preemptions", False), ("wall (s)", "wall_s", False),
            ("sim: SLO attainment", "sim_slo_attainment", True),
            ("sim: P95 latency (s)", "sim_p95_s", False)]
    lines = [f"{meta.get('workload')} on {meta.get('model')}: {meta.get('requests')} requests, "
             f"target load {meta.get('load')} ({meta.get('arrival')}), seed {meta.get('seed')}, "
             f"shapes {', '.join(meta.get('shapes', []))}"]
    head = f"{'':24}" + "".join(f"{n:>14}" for n in names)
    lines += [head, "-" * len(head)]
    for label, key, pct in rows:
        lines.append(f"{label:24}" + "".join(f"{_fmt(results[n].get(key), pct):>14}"
                                             for n in names))
    for p, label in (("0", "high"), ("1", "normal"), ("2", "low")):
        lines.append(f"{'attainment ' + label:24}" + "".join(
            f"{_fmt(results[n]['per_priority'][p]['slo_attainment'], True):>14}" for n in names))
        lines.append(f"{'P95 ' + label + ' (s)':24}" + "".join(
            f"{_fmt(results[n]['per_priority'][p]['p95_s']):>14}" for n in names))
    for n in names:
        r = results[n]
        if r.get("sim_p95_s"):
            d_att = 100 * (r["sim_slo_attainment"] - r["slo_attainment"])
            d_p95 = 100 * (r["sim_p95_s"] / r["p95_s"] - 1)
            lines.append(f"sim vs real ({n}): attainment {d_att:+.1f} points, P95 {d_p95:+.1f}%")
    if len(names) > 1:
        base = results[names[0]]["p95_s"]
        for n in names[1:]:
            lines.append(f"P95 {n} / {names[0]}: {results[n]['p95_s'] / base:.3f}")
    return "\n".join(lines)
