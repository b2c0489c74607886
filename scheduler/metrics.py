"""Metrics over simulated (or served) requests: attainment, latency percentiles, preemptions."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .simulator import Record


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation between order statistics."""
    if not values:
        return math.nan
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _class_summary(records: Sequence[Record]) -> dict:
    lat = [r.latency for r in records]
    if not records:
        return {
            "requests": 0,
            "slo_attainment": None,
            "p95_s": None,
            "p99_s": None,
            "wait_p99_s": None,
            "wait_max_s": None,
        }
    wait = [r.started - r.request.arrival for r in records]
    return {
        "requests": len(records),
        "slo_attainment": sum(r.met for r in records) / len(records),
        "p95_s": percentile(lat, 95),
        "p99_s": percentile(lat, 99),
        "wait_p99_s": percentile(wait, 99),
        "wait_max_s": max(wait),
    }


def summarize(records: Sequence[Record]) -> dict:
    """Attainment (met deadline / all), P50/P95/P99/max/mean latency (s), preemptions per
    request, offloads and parks (part-done steps parked) per request, and ``per_priority``
    {"0","1","2"} → attainment, P95/P99 latency and P99/max wait (arrival to start)."""
    if not records:
        raise ValueError("no records to summarize")
    lat = [r.latency for r in records]
    return {
        "requests": len(records),
        "slo_attainment": sum(r.met for r in records) / len(records),
        "p50_s": percentile(lat, 50),
        "p95_s": percentile(lat, 95),
        "p99_s": percentile(lat, 99),
        "max_s": max(lat),
        "mean_s": sum(lat) / len(lat),
        "preemptions": sum(r.preemptions for r in records) / len(records),
        "offloads": sum(r.offloads for r in records) / len(records),
        "parks": sum(r.parks for r in records) / len(records),
        "per_priority": {
            str(p): _class_summary([r for r in records if r.request.priority == p])
            for p in (0, 1, 2)
        },
    }
