"""Block-level vs step-level preemption in the simulator (issue 7).

For each scenario (workload, SLO scale) and policy, the same traces run with
``preemption="step"`` (baseline) and ``"block"``; the table gives attainment, priority-0
attainment, P99 latency and worst wait (arrival → start), priority-0 *image* P99 (the
requests that wait behind video steps), parks per request, and the share of device time the
preemption points cost. Deterministic: the same command gives the same numbers.

    python benchmarks/scheduler/block_preemption.py [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json

from ditmem.scheduler import CostModel, make_policy
from ditmem.scheduler.metrics import percentile, summarize
from ditmem.scheduler.simulator import simulate
from ditmem.scheduler.workloads import workload

SCENARIOS = (
    ("video-image-mix", 3.0),
    ("wan-mix", 3.0),
    ("video-image-mix", 2.0),
    ("video-image-mix", 1.5),
    ("video-image-mix", 1.25),
)


def run(name: str, scale: float, policy: str, mode: str, seeds, requests, load, device) -> dict:
    cost = CostModel.load(device)
    records, busy, overhead, parks = [], 0.0, 0.0, 0
    for seed in seeds:
        reqs = workload(name, cost, load=load, requests=requests, seed=seed, slo_scale=scale)
        res = simulate(reqs, make_policy(policy, cost), slo_scale=scale, preemption=mode)
        records += res.records
        busy += res.busy_s
        overhead += res.overhead_s
        parks += res.parks
    out = summarize(records)
    p0_images = [r.latency for r in records if r.request.priority == 0 and r.request.frames == 1]
    p0 = out["per_priority"]["0"]
    return {
        "workload": name,
        "slo_scale": scale,
        "policy": policy,
        "preemption": mode,
        "load": load,
        "device": device,
        "requests": out["requests"],
        "slo_attainment": out["slo_attainment"],
        "p0_attainment": p0["slo_attainment"],
        "p0_p99_s": p0["p99_s"],
        "p0_wait_max_s": p0["wait_max_s"],
        "p0_image_p99_s": percentile(p0_images, 99) if p0_images else None,
        "p99_s": out["p99_s"],
        "parks_per_request": parks / len(records),
        "overhead_share": overhead / busy if busy else 0.0,
        "per_priority": out["per_priority"],
    }


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, 300 requests")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--device", default="h200")
    ap.add_argument("--policies", default="srtf,slo")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    seeds = range(1 if args.quick else args.seeds)
    requests = 300 if args.quick else args.requests
    rows = []
    print(
        f"{'workload':<15} {'scale':>5} {'policy':<5} {'mode':<5} {'att%':>6} {'p0%':>6} "
        f"{'p0 P99 s':>9} {'x step':>6} {'p0 img P99':>10} {'p0 maxwait':>10} "
        f"{'parks/r':>7} {'ovh%':>5}"
    )
    for name, scale in SCENARIOS:
        for policy in args.policies.split(","):
            base = None
            for mode in ("step", "block"):
                r = run(name, scale, policy, mode, seeds, requests, args.load, args.device)
                base = base or r
                r["p0_p99_vs_step"] = r["p0_p99_s"] / base["p0_p99_s"]
                rows.append(r)
                print(
                    f"{name:<15} {scale:5.2f} {policy:<5} {mode:<5} "
                    f"{100 * r['slo_attainment']:6.2f} {100 * r['p0_attainment']:6.2f} "
                    f"{r['p0_p99_s']:9.1f} {r['p0_p99_vs_step']:6.2f} "
                    f"{fmt(r['p0_image_p99_s'], '10.2f')} {r['p0_wait_max_s']:10.2f} "
                    f"{r['parks_per_request']:7.3f} {100 * r['overhead_share']:5.2f}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
        print(f"json: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
