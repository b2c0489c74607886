"""Timing and reporting helpers shared by the model benchmarks (bench_qwen.py, wan_step.py).

Callables are timed side by side: interleaved rounds after one warm-up, on process CPU time
by default (on a shared machine wall time mostly measures waiting for a core), and a ratio
is the median over rounds of baseline / ditmem time (both sides of a round see the same
load).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options every model benchmark takes: --quick, --json, --repeats, --threads,
    --clock."""
    ap.add_argument("--quick", action="store_true", help="tiny model only, fewer repeats")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--clock", choices=CLOCKS, default="cpu",
                    help="cpu: process CPU time (default; robust when other jobs share the "
                         "cores, use with --threads 1), wall: perf_counter")


def run_models(args: argparse.Namespace, run: Callable[..., list[dict]], quick_repeats: int,
               full_repeats: int) -> tuple[list[dict], int]:
    """Apply ``--threads``, then ``run(model, repeats, clock)`` for the tiny model (and the
    small one unless ``--quick``); returns (all rows, repeats used)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (quick_repeats if args.quick else full_repeats)
    rows = []
    for model in ("tiny",) if args.quick else ("tiny", "small"):
        rows += run(model, repeats, CLOCKS[args.clock])
    return rows, repeats


def side_by_side(fns: dict[str, Callable[[], object]], repeats: int,
                 clock: Callable[[], float] = time.process_time) -> dict[str, list[float]]:
    """Interleave the callables, ``repeats`` rounds after one warm-up; per-round seconds
    on ``clock``."""
    times = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = clock()
            f()
            times[k].append(clock() - t0)
    return times


def summary(times: dict[str, list[float]], base: str, key: str) -> dict:
    """Medians and the median over rounds of base/key (robust to a noisy, shared machine:
    both sides of a round see the same load)."""
    ratios = [b / k for b, k in zip(times[base], times[key], strict=True)]
    return dict(baseline_s=statistics.median(times[base]), ditmem_s=statistics.median(times[key]),
                ratio=statistics.median(ratios))


def rel_err(outs, refs) -> float:
    """Largest ``||out - ref|| / ||ref||`` over paired tensors."""
    return max(((o - r).norm() / r.norm()).item() for o, r in zip(outs, refs, strict=True))


def write_json(path: str, repeats: int, clock: str, rows: list[dict]) -> None:
    """The run's settings and rows as JSON at ``path``."""
    with open(path, "w") as f:
        json.dump({"threads": torch.get_num_threads(), "repeats": repeats,
                   "clock": clock, "rows": rows}, f, indent=2)
