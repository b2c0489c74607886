"""What the simulator predicts for `ditmem demo`'s workload on a measured CPU profile: each
policy with each decode mode, over several seeds, beside the offline bound and the
clairvoyant reference for the same traces (no model runs). The simulated device draws
every time around the profile (``--noise``, lognormal σ, default 3 %, seeded per trace; 0:
exact), and the policies learn it only through their online correction.

Columns: attainment (all, per priority), P50, P95, P99 and maximum latency pooled over the
traces, P95 and P99 beside fifo's. Rows: fifo with the decode right after the last step
(run to completion: the baseline), srtf and slo with the decode inline or tile by tile
between steps (``--decode tiled``, what the demo runs for them). The profile must carry a
decode tile geometry for the tiled rows (`ditmem profile` writes one for tiny-qwen-image).

    python benchmarks/serving/demo_prediction.py --profile P.json [--seeds 5] [--requests 150]
        [--divisor 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from ditmem.scheduler import CostModel, make_policy
from ditmem.scheduler.bound import clairvoyant_misses, min_misses
from ditmem.scheduler.metrics import summarize
from ditmem.scheduler.noise import DEFAULT_SIGMA, TimingNoise
from ditmem.scheduler.simulator import simulate

ROWS = [("fifo", "inline"), ("srtf", "inline"), ("srtf", "tiled"), ("slo", "inline"),
        ("slo", "tiled")]


def demo_trace(cost, divisor: int, requests: int, seed: int, load: float, exact_load: bool):
    """The demo's trace (``ditmem.tools.demo.build_trace`` without the engine)."""
    from ditmem.tools.demo import build_trace

    args = argparse.Namespace(workload="seed-mix", load=load, requests=requests, seed=seed,
                              arrival="poisson", divisor=divisor)
    return build_trace(args, cost, exact_load)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--profile", required=True)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--requests", type=int, default=150)
    p.add_argument("--divisor", type=int, default=2)
    p.add_argument("--load", type=float, default=0.8)
    p.add_argument("--noise", type=float, default=DEFAULT_SIGMA,
                   help="timing noise of the simulated device (lognormal sigma; 0: exact)")
    p.add_argument("--as-drawn", action="store_true",
                   help="replay each trace as drawn, not scaled to the exact load (the demo "
                        "before session 17; reproduces the earlier tables)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    cost = CostModel.load(args.profile)
    traces = [demo_trace(cost, args.divisor, args.requests, s, args.load, not args.as_drawn)
              for s in range(args.seeds)]
    n = sum(len(t) for t in traces)
    bound = 1 - sum(min_misses([dataclasses.replace(r) for r in t], cost) for t in traces) / n
    clair = 1 - sum(clairvoyant_misses([dataclasses.replace(r) for r in t], cost)
                    for t in traces) / n
    rows = []
    for policy, decode in ROWS:
        records = []
        for seed, t in enumerate(traces):
            reqs = [dataclasses.replace(r) for r in t]
            records += simulate(reqs, make_policy(policy, cost.fresh()), decode=decode,
                                noise=TimingNoise(args.noise, 0.0, seed)).records
        m = summarize(records)
        rows.append(dict(policy=policy, decode=decode, load=args.load,
                         divisor=args.divisor, device=cost.name, **m))
    base, base99 = rows[0]["p95_s"], rows[0]["p99_s"]
    print(f"demo workload (seed-mix /{args.divisor}, rho {args.load}, {args.seeds} seeds x "
          f"{args.requests}, noise {args.noise:g}) on {args.profile}")
    print(f"{'policy':6} {'decode':7} {'att%':>6} {'p0%':>6} {'p1%':>6} {'p2%':>6} "
          f"{'P50 s':>7} {'P95 s':>7} {'P95/fifo':>8} {'P99 s':>7} {'P99/fifo':>8} "
          f"{'max s':>7}")
    for r in rows:
        pp = r["per_priority"]
        print(f"{r['policy']:6} {r['decode']:7} {100 * r['slo_attainment']:6.1f} "
              + " ".join(f"{100 * pp[k]['slo_attainment']:6.1f}" for k in ("0", "1", "2"))
              + f" {r['p50_s']:7.2f} {r['p95_s']:7.2f} {r['p95_s'] / base:8.2f}"
              f" {r['p99_s']:7.2f} {r['p99_s'] / base99:8.2f} {r['max_s']:7.2f}")
    print(f"offline bound: any policy <= {100 * bound:.1f} %; clairvoyant EDF reaches "
          f"{100 * clair:.1f} %")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "bound_attainment": bound,
                       "clairvoyant_attainment": clair}, f, indent=2)


if __name__ == "__main__":
    main()
