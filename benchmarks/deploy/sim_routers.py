"""The simulated router figures of issue 17, one command: R replicas x D h200 behind the
ditmem router, round-robin and power-of-two, every setting of the target (seed-mix and
omni-mix, Poisson and gamma CV 2, rho 0.8) plus context points, each row beside its bound.

    python benchmarks/deploy/sim_routers.py [--seeds 5] [--requests 2000] [--json OUT]
        [--settings target|context|all] [--report-s 5]

Every router of a setting runs in one process on the same traces (the same seeds), so a
row's ratios compare like with like. The bound beside each attainment: 100 %, so "ditmem
>= 2 points above a baseline" is forbidden wherever that baseline reaches > 98 %; the
table prints the largest gain that ceiling leaves (100 - the baseline's attainment).
Cost: each node replica runs once, fed live (``ditmem.scheduler.cluster_replica``): about
30 CPU-seconds per router and setting at 5 seeds x 2,000 requests on the 2-core CPU
machine (``--settings target``: about 6 minutes).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time

log = logging.getLogger("sim_routers")

#: (workload, arrival, rho, SLO scale): the target's four settings, then context.
TARGET = [("seed-mix", "poisson", 0.8, 3.0), ("seed-mix", "gamma:2", 0.8, 3.0),
          ("omni-mix", "poisson", 0.8, 3.0), ("omni-mix", "gamma:2", 0.8, 3.0)]
CONTEXT = [("omni-mix", "gamma:2", 0.9, 3.0), ("omni-mix", "gamma:2", 1.0, 3.0),
           ("omni-mix", "gamma:2", 1.2, 3.0), ("seed-mix", "gamma:2", 0.9, 3.0),
           ("seed-mix", "gamma:2", 1.0, 3.0), ("seed-mix", "gamma:2", 1.2, 3.0),
           ("seed-mix", "gamma:2", 0.9, 2.0)]
ROUTERS = ("ditmem", "round-robin", "pow2")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1, pooled")
    p.add_argument("--requests", type=int, default=2000, help="requests per seed")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--report-s", type=float, default=5.0)
    p.add_argument("--noise", type=float, default=0.03)
    p.add_argument("--settings", choices=("target", "context", "all"), default="target")
    p.add_argument("--setting", action="append", default=[], metavar="W,ARRIVAL,RHO,SLO",
                   help="run this setting instead (repeatable), e.g. omni-mix,gamma:2,1.2,3")
    p.add_argument("--json", default=None, help="write every row here")
    return p.parse_args(argv)


def settings(which: str, extra=()) -> list[tuple[str, str, float, float]]:
    """The named group, or the ``--setting`` strings when given (ValueError naming a bad
    one)."""
    out = []
    for spec in extra:
        parts = spec.split(",")
        try:
            name, arrival, rho, slo = parts
            out.append((name, arrival, float(rho), float(slo)))
        except ValueError:
            raise ValueError(f"--setting: W,ARRIVAL,RHO,SLO, got {spec!r}") from None
    return out or {"target": TARGET, "context": CONTEXT, "all": TARGET + CONTEXT}[which]


def run(args) -> list[dict]:
    from ditmem.scheduler.cluster_cli import run_cluster_point
    from ditmem.scheduler.cost import CostModel

    cost = CostModel.load("h200")
    rows = []
    for name, arrival, load, slo_scale in settings(args.settings, args.setting):
        for router in ROUTERS:
            t0 = time.process_time()
            row = run_cluster_point(
                cost, name, router, replicas=args.replicas, devices=args.devices,
                policy="slo", load=load, seeds=tuple(range(args.seeds)), arrival=arrival,
                slo_scale=slo_scale, noise=args.noise, bias=0.0, report_s=args.report_s,
                requests=args.requests)
            row["slo_scale"] = slo_scale
            row["cpu_s"] = time.process_time() - t0
            rows.append(row)
            if args.json:  # after every row: a run cut short keeps what it finished
                with open(args.json, "w") as fh:
                    json.dump(rows, fh, indent=1)
            log.info("%s %s rho %.2f slo x%g %s: %.2f %% P99 %.2f s (%.0f CPU s)", name,
                     arrival, load, slo_scale, router, 100 * row["slo_attainment"],
                     row["p99_s"], row["cpu_s"])
    return rows


def table(rows: list[dict]) -> str:
    """One line per router and setting: attainment, the ceiling's room, tails, and P99 as a
    ratio of the ditmem router's in the same setting."""
    head = (f"{'workload':<9} {'arrival':<8} {'rho':>4} {'slo':>4} {'router':<12} "
            f"{'att %':>7} {'room':>6} {'vs ditmem':>9} {'P50 s':>7} {'P95 s':>7} "
            f"{'P99 s':>7} {'P99/ditmem':>10}")
    out = [head]
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        key = (r["workload"], r["arrival"], r["load"], r["slo_scale"])
        groups.setdefault(key, {})[r["router"]] = r
    for (name, arrival, load, slo), by in groups.items():
        ref = by.get("ditmem")
        for router, r in by.items():
            att = 100 * r["slo_attainment"]
            room = 100 - att
            gap = "" if ref is None or router == "ditmem" else \
                f"{100 * ref['slo_attainment'] - att:+.2f}"
            ratio = "" if ref is None or router == "ditmem" else \
                f"{r['p99_s'] / ref['p99_s']:.3f}"
            out.append(f"{name:<9} {arrival:<8} {load:4.2f} {slo:4g} {router:<12} "
                       f"{att:7.2f} {room:6.2f} {gap:>9} {r['p50_s']:7.2f} {r['p95_s']:7.2f} "
                       f"{r['p99_s']:7.2f} {ratio:>10}")
    return "\n".join(out)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    if args.seeds < 1 or args.requests < 1:
        log.error("--seeds and --requests must be >= 1")
        return 2
    try:
        rows = run(args)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    sys.stdout.write(f"{args.replicas} replicas x {args.devices} h200, node policy slo, "
                     f"{args.seeds} seeds x {args.requests} requests, reports every "
                     f"{args.report_s:g} s, noise {args.noise:g}; {platform.node()} "
                     f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
                     "room: 100 - attainment (the most any router can gain over that row)\n")
    sys.stdout.write(table(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
