"""slo's tail beside fifo's, the default against ``slo`` options on the same traces (issue 13).

Session 18: late requests wait in the late lane until the busy period ends, which sets
slo's P99 on the one-device demo traces at 1.4–1.7 × fifo's. The session screened a rule
that lent on-time slack to late *steps* (``late_step_margin``, a patch not kept:
docs/results/scheduler.md, "Session 18"); the script runs the default and any ``slo``
option as a variant (``--variant NAME=OPT:JSON,...``) on the same traces, noise on.

Parts (``--part``):

* ``demo`` — the one-device demo's traces as ``benchmarks/serving/demo_prediction.py``
  builds them (``--profile``, ``--seeds`` traces of ``--requests``, scaled to the exact
  load), each with timing noise seeded by its trace (σ ``--noise``); fifo with the decode
  inline, slo with tiled decodes (as the demo runs them). Per variant: attainment, P99,
  P99 ÷ fifo's and the maximum pooled over the traces; the mean per-trace P99 ÷ fifo's and
  on how many traces it is ≤ 1; and the *floor*: on how many traces the P99 would be ≤
  fifo's if every missed request finished exactly at its deadline (the least a miss can
  take) and every other request as it did — where it is not, no rule that only runs the
  late work sooner (which can only delay the rest) meets P99 ≤ fifo's without fewer
  misses; the clairvoyant reference on the same traces.
* ``seed-mix`` — seed-mix on h200 at ρ ``--load`` (``--seeds`` × ``--requests``,
  ``--arrival``), decode inline; pooled attainment, priority 0, and P95, P99 and max ÷
  fifo's.

    python benchmarks/scheduler/late_steps.py --part demo --profile P.json --seeds 10 \\
        [--variant tiles=late_tile_margin:0.2,late_rank:'"arrival"'] [--json OUT]
    python benchmarks/scheduler/late_steps.py --part seed-mix --seeds 0-4 --requests 2000 \\
        [--arrival gamma:2] [--variant ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "serving"))

from class_drift import seeds_arg  # noqa: E402
from demo_prediction import demo_trace  # noqa: E402
from replay_bench import parse_setting  # noqa: E402

from ditmem.scheduler import CostModel  # noqa: E402
from ditmem.scheduler.bound import clairvoyant_misses  # noqa: E402
from ditmem.scheduler.metrics import percentile, summarize  # noqa: E402
from ditmem.scheduler.noise import DEFAULT_SIGMA, TimingNoise  # noqa: E402
from ditmem.scheduler.policies import make_policy  # noqa: E402
from ditmem.scheduler.simulator import simulate  # noqa: E402
from ditmem.scheduler.workloads import workload  # noqa: E402

log = logging.getLogger("late_steps")


def _run(reqs, cost, policy, options, decode, sigma, seed):
    """One run's records; a fresh ``TimingNoise`` per run (its draws go in call order)."""
    pol = make_policy(policy, cost.fresh(), **options)
    return simulate([dataclasses.replace(r) for r in reqs], pol, decode=decode,
                    noise=TimingNoise(sigma, 0.0, seed)).records


def floor_p99(records) -> float:
    """The P99 of one trace's latencies with every missed request at its own SLO window."""
    lat = [r.finished - r.request.arrival for r in records]
    return percentile([x if r.met else min(x, r.request.deadline - r.request.arrival)
                       for x, r in zip(lat, records, strict=True)], 99)


def _p0(summary: dict) -> float | None:
    return summary["per_priority"].get("0", {}).get("slo_attainment")


def demo_part(variants: dict[str, dict], args) -> dict:
    """The demo traces: fifo, then each slo variant (module docstring)."""
    cost = CostModel.load(args.profile)
    traces = [demo_trace(cost, args.divisor, args.requests, s, args.load, True)
              for s in range(args.seeds)]
    n = sum(len(t) for t in traces)
    clair = 1 - sum(clairvoyant_misses([dataclasses.replace(r) for r in t], cost)
                    for t in traces) / n
    runs: dict[str, list] = {}
    for seed, t in enumerate(traces):
        t0 = time.time()
        noise = (args.noise, seed)
        runs.setdefault("fifo", []).append(_run(t, cost, "fifo", {}, "inline", *noise))
        for name, opts in variants.items():
            runs.setdefault(name, []).append(_run(t, cost, "slo", opts, "tiled", *noise))
        log.info("demo trace %d: %.1f s", seed, time.time() - t0)
    fifo = summarize([r for recs in runs["fifo"] for r in recs])
    fifo99 = [summarize(recs)["p99_s"] for recs in runs["fifo"]]
    rows = []
    for name in ["fifo", *variants]:
        s = summarize([r for recs in runs[name] for r in recs])
        per = [summarize(recs)["p99_s"] / f
               for recs, f in zip(runs[name], fifo99, strict=True)]
        floor = [floor_p99(recs) / f for recs, f in zip(runs[name], fifo99, strict=True)]
        rows.append(dict(variant=name, options=variants.get(name, {}),
                         attainment=s["slo_attainment"], p0=_p0(s), p99_s=s["p99_s"],
                         p99_ratio=s["p99_s"] / fifo["p99_s"], max_s=s["max_s"],
                         trace_p99_ratio_mean=statistics.mean(per),
                         traces_p99_met=sum(x <= 1.0 for x in per), trace_p99_ratio=per,
                         traces_floor_met=sum(x <= 1.0 for x in floor),
                         trace_floor_ratio=floor))
    return dict(part="demo", profile=args.profile, seeds=args.seeds, requests=args.requests,
                load=args.load, noise=args.noise, clairvoyant_attainment=clair, rows=rows)


def seed_mix_part(variants: dict[str, dict], args) -> dict:
    """seed-mix on h200: fifo, then each slo variant, pooled over the seeds."""
    cost = CostModel.load("h200")
    runs: dict[str, list] = {}
    for seed in args.seed_list:
        t0 = time.time()
        reqs = workload("seed-mix", cost, load=args.load, requests=args.requests, seed=seed,
                        arrival=args.arrival)
        noise = (args.noise, seed)
        runs.setdefault("fifo", []).extend(_run(reqs, cost, "fifo", {}, "inline", *noise))
        for name, opts in variants.items():
            runs.setdefault(name, []).extend(_run(reqs, cost, "slo", opts, "inline", *noise))
        log.info("seed-mix seed %d: %.1f s", seed, time.time() - t0)
    fifo = summarize(runs["fifo"])
    rows = []
    for name in ["fifo", *variants]:
        s = summarize(runs[name])
        rows.append(dict(variant=name, options=variants.get(name, {}),
                         attainment=s["slo_attainment"], p0=_p0(s), p95_s=s["p95_s"],
                         p99_s=s["p99_s"], max_s=s["max_s"],
                         p95_ratio=s["p95_s"] / fifo["p95_s"],
                         p99_ratio=s["p99_s"] / fifo["p99_s"],
                         max_ratio=s["max_s"] / fifo["max_s"]))
    return dict(part="seed-mix", device="h200", load=args.load, seeds=args.seed_list,
                requests=args.requests, arrival=args.arrival, noise=args.noise, rows=rows)


def _pct(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}"


def print_part(out: dict) -> None:
    if out["part"] == "demo":
        print(f"\ndemo traces: {out['seeds']} x {out['requests']} at load {out['load']}, "
              f"noise {out['noise']:g}, profile {out['profile']}; clairvoyant "
              f"{100 * out['clairvoyant_attainment']:.1f} %")
        print(f"{'variant':<14} {'att %':>6} {'p0 %':>6} {'P99 s':>7} {'P99/fifo':>8} "
              f"{'max s':>7} {'trace P99/fifo mean':>19} {'traces <= fifo':>14} "
              f"{'floor <= fifo':>13}")
        for r in out["rows"]:
            print(f"{r['variant']:<14} {100 * r['attainment']:6.1f} {_pct(r['p0'], 1):>6} "
                  f"{r['p99_s']:7.2f} {r['p99_ratio']:8.2f} {r['max_s']:7.2f} "
                  f"{r['trace_p99_ratio_mean']:19.2f} "
                  f"{r['traces_p99_met']:>8} of {out['seeds']:<3} "
                  f"{r['traces_floor_met']:>7} of {out['seeds']:<3}")
        return
    print(f"\nseed-mix/h200 rho {out['load']}: seeds {out['seeds']} x {out['requests']}, "
          f"arrival {out['arrival']}, noise {out['noise']:g}")
    print(f"{'variant':<14} {'att %':>6} {'p0 %':>6} {'P95 s':>7} {'P99 s':>7} {'max s':>7} "
          f"{'P95/f':>6} {'P99/f':>6} {'max/f':>6}")
    for r in out["rows"]:
        print(f"{r['variant']:<14} {100 * r['attainment']:6.2f} {_pct(r['p0'], 2):>6} "
              f"{r['p95_s']:7.1f} {r['p99_s']:7.1f} {r['max_s']:7.1f} {r['p95_ratio']:6.2f} "
              f"{r['p99_ratio']:6.2f} {r['max_ratio']:6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="demo", choices=("demo", "seed-mix"))
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=OPT:JSON,... slo options beside the default (repeatable)")
    ap.add_argument("--profile",
                    default="benchmarks/serving/results/demo_s16_run1_profile.json",
                    help="demo: the CPU profile the traces and the simulated device use")
    ap.add_argument("--seeds", default=None,
                    help="demo: number of traces (default 10); seed-mix: seeds, e.g. 0-4 "
                         "(default)")
    ap.add_argument("--requests", type=int, default=None,
                    help="requests per trace (demo 150, seed-mix 2000)")
    ap.add_argument("--divisor", type=int, default=2, help="demo: side divisor")
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--arrival", default="poisson", help="seed-mix: poisson | gamma:CV")
    ap.add_argument("--noise", type=float, default=DEFAULT_SIGMA,
                    help="timing noise (lognormal sigma; 0: exact)")
    ap.add_argument("--json", help="write the table here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    variants = {"default": {}}
    for text in args.variant:
        name, _, opts = parse_setting(text)
        variants[name] = opts
    if args.part == "demo":
        args.seeds = int(args.seeds or 10)
        args.requests = args.requests or 150
        out = demo_part(variants, args)
    else:
        args.seed_list = seeds_arg(args.seeds or "0-4")
        args.requests = args.requests or 2000
        out = seed_mix_part(variants, args)
    out["command"] = " ".join(sys.argv)
    print_part(out)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
        print(f"json: {args.json}")


if __name__ == "__main__":
    main()
