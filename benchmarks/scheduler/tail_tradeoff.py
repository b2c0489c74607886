"""What the tail bound of ``slo`` costs: attainment against P95/P99/max latency for settings of
its late lane (``late_windows``, ``late_share``), beside fifo, on the same traces (seed-mix,
h200, Poisson ρ 0.8, timing noise 3 %).

    python benchmarks/scheduler/tail_tradeoff.py [--seeds 2] [--requests 2000] [--json OUT]

Each row is pooled over the seeds; ``/fifo`` columns are the ratio to fifo's on the same
traces. ``late_windows=1e9`` is the previous rule (late requests only in spare time, no
bound).
"""

from __future__ import annotations

import argparse
import json

from ditmem.scheduler import CostModel
from ditmem.scheduler.experiment import Scenario, run_point

SETTINGS = [
    ("no bound (spare time only)", {"late_windows": 1e9}),
    ("default: 3 windows, share 0.1", {}),
    ("10 windows, share 0.5", {"late_windows": 10.0, "late_share": 0.5}),
    ("6 windows, share 0.5", {"late_windows": 6.0, "late_share": 0.5}),
    ("3 windows, share 0.5", {"late_windows": 3.0, "late_share": 0.5}),
    ("4 windows, share 1", {"late_windows": 4.0, "late_share": 1.0}),
    ("1 window, share 1", {"late_windows": 1.0, "late_share": 1.0}),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    cost = CostModel.load("h200")
    rows = []
    base = dict(cost=cost, workload="seed-mix", requests=args.requests,
                seeds=tuple(range(args.seeds)))
    fifo = run_point(Scenario(**base), "fifo", args.load)
    fifo["setting"] = "fifo"
    rows.append(fifo)
    for label, opts in SETTINGS:
        row = run_point(Scenario(**base, policy_options={"slo": opts}), "slo", args.load)
        row["setting"], row["options"] = label, opts
        rows.append(row)
    print(f"seed-mix h200 Poisson ρ {args.load}, {args.seeds} × {args.requests} requests, "
          "noise 3 %")
    print(f"{'setting':<32} {'att %':>6} {'p0 %':>6} {'P95 s':>7} {'P99 s':>7} {'max s':>7} "
          f"{'P95/fifo':>8} {'P99/fifo':>8} {'max/fifo':>8}")
    for r in rows:
        p0 = r["per_priority"]["0"]["slo_attainment"]
        print(f"{r['setting']:<32} {100 * r['slo_attainment']:6.2f} {100 * p0:6.2f} "
              f"{r['p95_s']:7.1f} {r['p99_s']:7.1f} {r['max_s']:7.1f} "
              f"{r['p95_s'] / fifo['p95_s']:8.2f} {r['p99_s'] / fifo['p99_s']:8.2f} "
              f"{r['max_s'] / fifo['max_s']:8.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
        print(f"json: {args.json}")


if __name__ == "__main__":
    main()
