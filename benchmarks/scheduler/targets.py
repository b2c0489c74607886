"""The scheduler's targets, measured: seed-mix on h200 at ρ = 0.8 (2,000 requests, 5 seeds)
under fifo, srtf and slo, with the offline bound, goodput by bisection, other workloads,
bursty arrivals, other devices and ablations of slo. Writes JSON and prints tables.

    python benchmarks/scheduler/targets.py [--quick] [--json OUT] [--plot OUT.png]
    python benchmarks/scheduler/targets.py --explain-p0 [--seeds 5,6,7,8,9]
    python benchmarks/scheduler/targets.py --p0-rules [--json OUT]

--quick: 300 requests, 2 seeds, no goodput bisection (a smoke run, ~1 min).
--explain-p0: only the priority-0 misses of slo and of its previous rules on seed-mix h200
ρ 0.8 (shape, arrival, what ran in the window); --seeds picks other seeds (held-out check).
--p0-rules: slo's priority-0 options (``P0_RULES``) beside the default on seed-mix seeds 0–4,
held-out seeds 5–9 and gamma CV 2 seeds 0–4 (h200, ρ 0.8, noise on), each beside its bound
and clairvoyant reference (~10 min).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ditmem.scheduler import CostModel
from ditmem.scheduler.bound import clairvoyant_misses, min_misses
from ditmem.scheduler.experiment import (
    Scenario,
    explain_misses,
    goodput,
    plot_sweep,
    run_point,
)

POLICIES = ("fifo", "srtf", "slo")
ABLATIONS = {
    "slo": {},
    "slo-no-shield0": {"shield0": False},
    "slo-late-by-arrival": {"late_rank": "arrival"},
    "slo-v1-rules": {"shield0": False, "late_rank": "arrival", "rescue0": 0.0},
    "slo-no-rescue0": {"rescue0": 0.0},
    "slo-rescue0,guard=1": {"rescue0": 0.5, "rescue_guard": 1.0},
    "slo-no-batching": {"batching": False},
    "slo-no-forecast": {"forecast": False},
    "slo-join-margin0=0.2": {"join_margin0": 0.2},
    "slo-forecast-shield0": {"forecast_shield0": True},
}

#: The priority-0 rules of Session 8 (``--p0-rules``), beside the default.
P0_RULES = {
    "slo": {},
    "slo join_margin0=0.2": {"join_margin0": 0.2},
    "slo forecast_shield0": {"forecast_shield0": True},
    "slo both": {"join_margin0": 0.2, "forecast_shield0": True},
    "slo both + lone_p0_unpacked": {"join_margin0": 0.2, "forecast_shield0": True,
                                    "lone_p0_unpacked": True},
}


def line(r: dict, label: str | None = None) -> str:
    pp = r["per_priority"]
    p = [pp[k]["slo_attainment"] for k in ("0", "1", "2")]
    att = " ".join(f"{100 * x:6.2f}" if x is not None else "     -" for x in p)
    return (
        f"{label or r['policy']:<26} {r['workload']:<15} {r['device']:<11} "
        f"{r['arrival']:<9} {r['load']:4.2f} {100 * r['slo_attainment']:7.2f} {att} "
        f"{r['p50_s']:8.2f} {r['p95_s']:8.2f} {r['p99_s']:8.2f} {r['preemptions']:5.2f}"
    )


HEAD = (
    f"{'policy':<26} {'workload':<15} {'device':<11} {'arrival':<9} {'load':>4} "
    f"{'att%':>7} {'p0%':>6} {'p1%':>6} {'p2%':>6} {'P50 s':>8} {'P95 s':>8} "
    f"{'P99 s':>8} {'preem':>5}"
)


def bound_row(sc: Scenario, load: float) -> dict:
    """Offline bounds on the scenario's traces at ``load``: the profile bound (default), the
    FLOPs (device-physics) bound, the first version's rule, priority 0 alone, clairvoyant."""
    total = p0_total = clair = clair_relaxed = 0
    lower = dict.fromkeys(("profile", "flops", "flops-single", "p0"), 0)
    for seed in sc.seeds:
        reqs = sc.requests_for(load, seed)
        total += len(reqs)
        lower["profile"] += min_misses(reqs, sc.cost)
        lower["flops"] += min_misses(reqs, sc.cost, work="flops")
        v1_horizon = 4 * max(r.deadline - r.arrival for r in reqs)  # the first version's
        lower["flops-single"] += min_misses(
            reqs, sc.cost, v1_horizon, work="flops", windows="single"
        )
        p0 = [r for r in reqs if r.priority == 0]
        p0_total += len(p0)
        lower["p0"] += min_misses(p0, sc.cost) if p0 else 0
        clair += clairvoyant_misses(reqs, sc.cost)
        clair_relaxed += clairvoyant_misses(reqs, sc.cost, "profile")
    return {
        "workload": sc.name(),
        "device": sc.cost.name,
        "arrival": sc.arrival,
        "load": load,
        "requests": total,
        "bound_max_attainment": 1 - lower["profile"] / total,
        "bound_flops_max_attainment": 1 - lower["flops"] / total,
        "bound_v1_max_attainment": 1 - lower["flops-single"] / total,
        "bound_p0_max_attainment": 1 - lower["p0"] / p0_total if p0_total else None,
        "clairvoyant_attainment": 1 - clair / total,
        "clairvoyant_relaxed_attainment": 1 - clair_relaxed / total,
    }


def bound_goodput(
    sc: Scenario, work: str = "profile", lo: float = 0.05, hi: float = 1.2, tol: float = 0.002
) -> float:
    """Highest load at which the offline bound (``work``; ``"clairvoyant"``: the clairvoyant
    reference on standalone times instead) still allows 99 % attainment, by bisection."""

    def ok(load):
        misses = total = 0
        for seed in sc.seeds:
            reqs = sc.requests_for(load, seed)
            total += len(reqs)
            if work == "clairvoyant":
                misses += clairvoyant_misses(reqs, sc.cost)
            else:
                misses += min_misses(reqs, sc.cost, work=work)
        return 1 - misses / total >= 0.99

    if not ok(lo):
        return 0.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return round(lo, 4)


def say_bound(b: dict) -> None:
    print(
        f"   bound <= {100 * b['bound_max_attainment']:.2f} % (profile), "
        f"{100 * b['bound_flops_max_attainment']:.2f} % (FLOPs), "
        f"{100 * b['bound_v1_max_attainment']:.2f} % (v1); clairvoyant "
        f"{100 * b['clairvoyant_attainment']:.2f} % (standalone times), "
        f"{100 * b['clairvoyant_relaxed_attainment']:.2f} % (profile works: the relaxation)",
        flush=True,
    )


def explain_p0(seeds: tuple[int, ...], n: int, path: str) -> int:
    """Print (and write as JSON) each priority-0 miss of slo and of its previous rules."""
    out = []
    for label in ("slo", "slo-v1-rules"):
        sc = Scenario(
            cost=CostModel.load("h200"),
            workload="seed-mix",
            requests=n,
            seeds=seeds,
            policy_options={"slo": ABLATIONS[label]},
        )
        r = run_point(sc, "slo", 0.8)
        p0 = r["per_priority"]["0"]["slo_attainment"]
        print(f"== {label}: attainment {100 * r['slo_attainment']:.2f} %, p0 {100 * p0:.2f} %")
        misses = explain_misses(sc, "slo", 0.8)
        for m in misses:
            ran = ", ".join(f"{k} {v:.1f} s" for k, v in list(m["ran"].items())[:5])
            print(
                f"seed {m['seed']} {m['id']} {m['shape']}: arrived {m['arrival_s']:.0f} s, "
                f"window {m['window_s']:.1f} s, late by {m['late_by_s']:.1f} s; ran: {ran}"
            )
        out.append({"label": label, "options": ABLATIONS[label], "point": r, "misses": misses})
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"json: {path}")
    return 0


def p0_rules(n: int, path: str) -> int:
    """Print (and write as JSON) ``P0_RULES`` on the three figure sets, with their bounds."""
    h200 = CostModel.load("h200")
    sets = {"seed-mix 0-4": ("poisson", (0, 1, 2, 3, 4)),
            "held-out 5-9": ("poisson", (5, 6, 7, 8, 9)),
            "gamma CV 2 0-4": ("gamma:2", (0, 1, 2, 3, 4))}
    out = []
    for name, (arrival, seeds) in sets.items():
        base = Scenario(cost=h200, workload="seed-mix", requests=n, seeds=seeds, arrival=arrival)
        misses = clair = total = 0
        for seed in seeds:
            reqs = base.requests_for(0.8, seed)
            total += len(reqs)
            misses += min_misses(reqs, h200)
            clair += clairvoyant_misses(reqs, h200)
        bound, ref = 1 - misses / total, 1 - clair / total
        print(f"== {name}: bound <= {100 * bound:.2f} %, clairvoyant {100 * ref:.2f} %",
              flush=True)
        print(HEAD)
        for label, options in P0_RULES.items():
            sc = Scenario(cost=h200, workload="seed-mix", requests=n, seeds=seeds,
                          arrival=arrival, policy_options={"slo": options})
            r = run_point(sc, "slo", 0.8)
            print(line(r, label) + f"  max {r['max_s']:.1f}  "
                  f"(bound {100 * (r['slo_attainment'] - bound):+.2f})", flush=True)
            out.append({"set": name, "label": label, "options": options, "bound": bound,
                        "clairvoyant": ref, "point": r})
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    print(f"json: {path}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="benchmarks/scheduler/results/targets.json")
    ap.add_argument("--json-p0", default=None, help="JSON of --explain-p0 (default: results/)")
    ap.add_argument("--plot", default="benchmarks/scheduler/results/seed_mix_sweep.png")
    ap.add_argument("--explain-p0", action="store_true")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default 0-4)")
    ap.add_argument("--p0-rules", action="store_true",
                    help="only slo's priority-0 options beside the default (module docstring)")
    args = ap.parse_args(argv)
    n, seeds = (300, (0, 1)) if args.quick else (2000, (0, 1, 2, 3, 4))
    if args.seeds:
        seeds = tuple(int(x) for x in args.seeds.split(","))
    if args.p0_rules:
        path = args.json if args.json != ap.get_default("json") else (
            "benchmarks/scheduler/results/targets_p0_rules_s8.json")
        return p0_rules(n, path)
    if args.explain_p0:
        tag = "_".join(map(str, seeds))
        path = args.json_p0 or f"benchmarks/scheduler/results/targets_p0_misses_seeds{tag}.json"
        return explain_p0(seeds, n, path)
    out: dict = {
        "requests_per_seed": n,
        "seeds": list(seeds),
        "main": [],
        "bound": [],
        "goodput": {},
        "other": [],
        "ablations": [],
        "sweep": [],
    }
    t0 = time.time()
    h200 = CostModel.load("h200")

    def sc(workload="seed-mix", cost=h200, arrival="poisson", requests=n, options=None):
        return Scenario(
            cost=cost,
            workload=workload,
            requests=requests,
            arrival=arrival,
            seeds=seeds,
            policy_options=options or {},
        )

    def say(*a):
        print(*a, flush=True)

    def policies_and_bound(s: Scenario, rows: list[dict]) -> dict:
        """Every policy on ``s`` at load 0.8 (rows appended to ``rows`` and printed), then
        the bound there (appended to ``out["bound"]`` and printed); returns the bound row."""
        for p in POLICIES:
            r = run_point(s, p, 0.8)
            rows.append(r)
            say(line(r))
        b = bound_row(s, 0.8)
        out["bound"].append(b)
        say_bound(b)
        return b

    say("== seed-mix, h200, poisson, load 0.8 ==")
    say(HEAD)
    main_sc = sc()
    b = policies_and_bound(main_sc, out["main"])
    say(f"   priority 0 alone: bound <= {100 * b['bound_p0_max_attainment']:.2f} %")
    fifo95 = out["main"][0]["p95_s"]
    say(
        f"P95 slo / fifo = {out['main'][2]['p95_s'] / fifo95:.3f}; "
        f"srtf / fifo = {out['main'][1]['p95_s'] / fifo95:.3f}"
    )

    if not args.quick:
        say("== goodput (highest load with >= 99 % attainment), seed-mix h200 poisson ==")
        for p in POLICIES:
            out["goodput"][p] = goodput(main_sc, p)
            say(f"goodput {p}: {out['goodput'][p]:.3f}")
        out["goodput"]["offline-bound"] = bound_goodput(main_sc)
        out["goodput"]["offline-bound-flops"] = bound_goodput(main_sc, "flops")
        out["goodput"]["clairvoyant"] = bound_goodput(main_sc, "clairvoyant")
        say(
            f"goodput allowed by the offline bound: {out['goodput']['offline-bound']:.3f} "
            f"(profile), {out['goodput']['offline-bound-flops']:.3f} (FLOPs); reached by the "
            f"clairvoyant reference on standalone times: {out['goodput']['clairvoyant']:.3f}"
        )
        say("== sweep ==")
        for load in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95):
            for p in POLICIES:
                out["sweep"].append(run_point(main_sc, p, load))
        plot_sweep(out["sweep"], args.plot, "seed-mix on h200, Poisson arrivals, 5 seeds")

    say("== other workloads, arrivals and devices (load 0.8) ==")
    say(HEAD)
    others = [
        sc("omni-mix"),
        sc("omni-preempt", requests=None),
        sc("omni-preempt", requests=n),
        sc(arrival="gamma:2"),
        sc(arrival="gamma:4"),
        sc(cost=CostModel.load("a100")),
        sc(cost=CostModel.load("ascend-910b")),
        sc("wan-mix", requests=n // 4),
        sc("wan-mix", cost=CostModel.load("h100"), requests=n // 4),
        sc("video-image-mix", requests=n // 2),
    ]
    for s in others:
        policies_and_bound(s, out["other"])

    say("== ablations of slo (seed-mix, h200, poisson, 0.8) ==")
    say(HEAD)
    for label, opts in ABLATIONS.items():
        r = run_point(sc(options={"slo": opts}), "slo", 0.8)
        r["label"] = label
        r["options"] = opts
        out["ablations"].append(r)
        say(line(r, label))
    out["wall_s"] = time.time() - t0
    with open(args.json, "w") as fh:
        json.dump(out, fh, indent=1)
    say(f"json: {args.json}  ({out['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
