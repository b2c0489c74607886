"""Node ``slo`` with a latency goal for scaling requests (``goal``) beside the default and
fifo, side by side on the same traces (8 × h200, noise on, σ 3 %).

    python benchmarks/scheduler/node_goal.py [--workloads seed-mix,omni-mix] [--loads 0.7]
        [--seeds 0,1] [--requests 1000] [--goals 0,0.17,0.21] [--fifo] [--json OUT]
        [--variants "tier:tier_goal=true;w50:tier_goal=true,tier_goal_window=50"] [--bound]

Per workload, load and goal (0: ``slo``'s default, no goal) the pooled attainment, priority-0
attainment, P50 / P95 / P99 / max latency (s), and per tier (request width) the median and
the tier's 67th percentile latency and its share of steps at each degree (where the P95
lies: seed-mix's at the 2048² tier's median, omni-mix's at the 1536² tier's 67th
percentile). ``--fifo`` adds the static fifo deployment at degree 1 (the best static one at
ρ 0.7, docs/results/node.md) for the P95 ÷ fifo's column. ``--variants``: more ``slo`` rows,
each ``NAME:opt=value,...`` (values parsed as JSON, else kept as strings), ``;``-separated.
``--bound``: per point, the offline attainment bound and the latency bounds (P95 / P99 / max
with the node's capacity; ``scheduler/node/bound.py``), printed and kept in each row. Rows
that make FIFO promises (``guard``) also print the share kept. Rows go to ``--json``.
"""

from __future__ import annotations

import argparse
import json

from node_demo_sim import parse_variant

from ditmem.scheduler import CostModel
from ditmem.scheduler.metrics import percentile
from ditmem.scheduler.node.experiment import NodeScenario, node_bound, run_node_point


def _tiers(rows: list[dict]) -> dict[str, dict]:
    """Per request width: count, median and 67th-percentile latency (s), steps per degree
    as shares of the tier's steps."""
    out: dict[str, dict] = {}
    for w in sorted({r["width"] for r in rows}):
        mine = [r for r in rows if r["width"] == w]
        lat = [r["latency_s"] for r in mine]
        steps: dict[str, int] = {}
        for r in mine:
            for d, k in r["degrees"].items():
                steps[d] = steps.get(d, 0) + k
        total = sum(steps.values()) or 1
        out[str(w)] = {
            "requests": len(mine),
            "p50_s": percentile(lat, 50),
            "p67_s": percentile(lat, 67),
            "degree_share": {
                d: k / total for d, k in sorted(steps.items(), key=lambda x: int(x[0]))
            },
        }
    return out


def _json_or_text(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_variants(spec: str) -> list[tuple[str, dict]]:
    """``NAME:opt=value,...;...`` → [("slo NAME", options)] (values as JSON where they
    parse, else the text)."""
    parts = filter(None, (p.strip() for p in spec.split(";")))
    return [(f"slo {name}", options)
            for name, options in (parse_variant(p, _json_or_text) for p in parts)]


def run(workloads, loads, seeds, requests, goals, fifo: bool, extra=(),
        bound: bool = False) -> list[dict]:
    """One row per (workload, load, variant): fifo d=1 when ``fifo``, then slo per goal,
    then the ``extra`` (name, slo options) variants; with ``bound`` each row carries the
    point's bounds (``node_bound`` with latency)."""
    cost = CostModel.load("h200")
    rows = []
    for wl in workloads:
        for load in loads:
            b = {}
            if bound:
                b = node_bound(NodeScenario(cost, 8, wl, requests=requests, seeds=tuple(seeds)),
                               load, latency=True)
                print(f"{wl:9s} ρ {load:.2f} bound: att {100 * b['bound_attainment']:6.2f} "
                      f"(clairvoyant {100 * b['clairvoyant_attainment']:6.2f}), P95 >= "
                      f"{b['p95_bound_s']:.2f}, P99 >= {b['p99_bound_s']:.2f}, max >= "
                      f"{b['max_bound_s']:.1f} s", flush=True)
            variants = [("fifo d=1", "fifo", {})] if fifo else []
            variants += [
                ("slo" if g == 0 else f"slo goal={g:g}", "slo", {"goal": g} if g else {})
                for g in goals
            ]
            variants += [(name, "slo", options) for name, options in extra]
            for name, policy, options in variants:
                sc = NodeScenario(cost, 8, wl, requests=requests, seeds=tuple(seeds),
                                  policy_options={policy: options}, per_request=True)
                row = run_node_point(sc, policy, load)
                per = row.pop("per_request")
                row["variant"] = name
                row["options"] = options
                row["tiers"] = _tiers(per)
                row.update(b)
                rows.append(row)
                print_row(row, rows)
    return rows


def print_row(row: dict, rows: list[dict]) -> None:
    base = next((r for r in rows if r["variant"] == "fifo d=1" and r["workload"] == row["workload"]
                 and r["load"] == row["load"]), None)
    p0 = row["per_priority"]["0"].get("slo_attainment")
    ratio = f"{row['p95_s'] / base['p95_s']:.3f}" if base else "-"
    kept = ""
    if "promises_kept" in row:
        kept = (f" kept {100 * row['promises_kept']:.2f} % "
                f"(late <= {row['promise_late_max_s']:.1f} s)")
    tiers = "  ".join(f"{w}: {t['p50_s']:.1f}/{t['p67_s']:.1f}" for w, t in row["tiers"].items())
    print(f"{row['workload']:9s} ρ {row['load']:.2f} {row['variant']:16s} "
          f"att {100 * row['slo_attainment']:6.2f} p0 {'-' if p0 is None else f'{100 * p0:6.2f}'} "
          f"P50 {row['p50_s']:5.2f} P95 {row['p95_s']:6.2f} P99 {row['p99_s']:6.2f} "
          f"max {row['max_s']:6.1f} P95/fifo {ratio}{kept}  tiers p50/p67 {tiers}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="seed-mix,omni-mix")
    ap.add_argument("--loads", default="0.7")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--goals", default="0,0.17,0.21", help="comma list; 0 = slo's default")
    ap.add_argument("--fifo", action="store_true", help="add fifo at degree 1")
    ap.add_argument("--variants", default="", help="NAME:opt=value,...;... more slo rows")
    ap.add_argument("--bound", action="store_true", help="the bounds of each point beside")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    goals = [float(g) for g in a.goals.split(",")]
    for g in goals:
        if not 0.0 <= g < 1.0:
            raise ValueError(f"--goals: each in [0, 1), got {g}")
    rows = run(a.workloads.split(","), [float(x) for x in a.loads.split(",")],
               [int(s) for s in a.seeds.split(",")], a.requests, goals, a.fifo,
               parse_variants(a.variants), a.bound)
    if a.json:
        with open(a.json, "w") as f:
            command = "python benchmarks/scheduler/node_goal.py " + " ".join(argv or [])
            json.dump({"command": command, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
