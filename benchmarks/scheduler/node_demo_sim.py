"""The two-device demo's trace in the node simulator: fifo, slo and slo variants over seeds.

    python benchmarks/scheduler/node_demo_sim.py [--seeds 0-9] [--profiles run6,run5]
        [--variants "fifo;slo;slo:min_gain=0.05"] [--job-latency S] [--json OUT]

``ditmem demo --devices 2`` replays seed-mix ÷ 2 at ρ 0.8 (150 requests, Poisson) on two
device workers, with the profile measured at its start; its targets (``ditmem.tools.
node_demo.targets``): slo ≥ 99 % attainment (or the bound − 0.5 point), P95 ≤ max(0.5 ×
fifo's, 1.2 × the P95 floor), P99 ≤ fifo's. The simulator predicted the last real run
(docs/results/node.md), so a policy is developed here: the same trace (``build_trace``)
for each seed and each saved demo profile (benchmarks/parallel/results/
demo_devices2_run*_profile.json), every policy simulated with timing noise on (3 %,
seeded), beside the trace's offline attainment bound and P95 floor (``limits``). The
baseline is ``fifo`` on two static single-device replicas, in the same run. A variant is
``policy[:option=value,...]`` (node policy options, e.g. ``slo:order_slack=0.0``); ``;``
separates variants. The table: per profile and seed, attainment / P95 / P99 per variant
and whether the three targets hold (``y``/``-``: attainment, P95, P99); then per variant
the count of (profile, seed) traces meeting each target, mean attainment and mean P95 /
fifo's.
Profile run4 (speed-ups below 1: a loaded machine) is left out by default.
``--job-latency S`` sets every profile's ``links.job_latency_s`` (each job's fixed cost
besides its stages, paid by the simulated devices and priced by the policies) to S s.

``--tier VARIANT`` prints instead what sets that variant's P95: the records of the large
tier (1024², the demo's largest) pooled per profile — its share, how many of the requests at
or above the P95 it holds, its time alone at degree 1 and 2, how many finish within 1.2 ×
the latter (the P95 bar), and per request on average: the wait before its first step, the
seconds lost to steps at degree 1 instead of 2, the rest (pauses between steps), steps at
degree 1, and whether another large request was alive alongside.

``--why VARIANTS`` (``;`` between them) prints where the time went
(``ditmem.scheduler.node.policies.recorder``), pooled over the traces: per large request
(1024²) and per missed request (from arrival to its deadline), the mean seconds in each
state — its own steps at each degree, its last job (last step + decode), or waiting while
the devices were held by a large request's decode, large steps or small requests — and how
many large requests finish within the trace's P95 bar (max(0.5 × fifo's P95, 1.2 × the
floor); the P95 needs about half of them there). ``--large-only`` replays only the 1024²
requests of each trace (what the policy gives the large tier with nothing else on the
node; the bar stays the full trace's).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import logging
import types
from pathlib import Path

from ditmem.scheduler import CostModel
from ditmem.scheduler.metrics import summarize
from ditmem.scheduler.node.cost import NodeCost
from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.policies.recorder import DecisionLog, time_split
from ditmem.scheduler.node.simulator import simulate_node
from ditmem.scheduler.node.topology import Node
from ditmem.scheduler.noise import TimingNoise
from ditmem.tools.node_demo import build_trace, limits, targets

RESULTS = Path(__file__).resolve().parents[1] / "parallel" / "results"
#: the baselines and slo (session 5's rules, once a variant here, were options until session
#: 17: ``git show f6bb14a:benchmarks/scheduler/node_demo_sim.py``)
DEFAULT_VARIANTS = "fifo;srtf;elastic-np;slo"
log = logging.getLogger("node_demo_sim")


def parse_variant(spec: str, value=ast.literal_eval) -> tuple[str, dict]:
    """``"slo:a=1,b=False"`` → ``("slo", {"a": 1, "b": False})`` (each value through
    ``value``: a Python literal by default)."""
    name, _, rest = spec.partition(":")
    options = {}
    for part in filter(None, rest.split(",")):
        key, sep, text = part.partition("=")
        if not sep:
            raise ValueError(f"variant {spec!r}: expected option=value, got {part!r}")
        options[key.strip()] = value(text)
    return name.strip(), options


def parse_seeds(text: str) -> list[int]:
    """``"0-4,7"`` → ``[0, 1, 2, 3, 4, 7]``."""
    out = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    return out


def simulate(spec: str, trace, cost: CostModel, devices: int, seed: int,
             bias_by: dict | None = None) -> dict:
    """One variant on ``trace``: ``summarize`` of the records, noise 3 % seeded ``seed``
    (``bias_by``: ``TimingNoise``'s drift by kind and class; none by default)."""
    name, options = parse_variant(spec)
    topo = Node(devices, NodeCost(cost).links)
    policy = make_node_policy(name, NodeCost(cost), topo, **options)
    result = simulate_node([dataclasses.replace(r) for r in trace], policy, topo,
                           noise=TimingNoise(0.03, 0.0, seed, bias_by or {}))
    return summarize(result.records)


def load_cost(prof: str, job_latency: float | None = None) -> CostModel:
    """The saved demo profile ``prof`` (``demo_devices2_<prof>_profile.json``); with
    ``job_latency`` (seconds), its ``links.job_latency_s`` set to it (the file untouched)."""
    with open(RESULTS / f"demo_devices2_{prof}_profile.json") as f:
        profile = json.load(f)
    if job_latency is not None:
        profile["links"]["job_latency_s"] = job_latency
    return CostModel.from_dict(profile)


def run(profiles: list[str], seeds: list[int], variants: list[str], *, devices: int = 2,
        load: float = 0.8, requests: int = 150, job_latency: float | None = None,
        exact_load: bool = True) -> list[dict]:
    """One row per (profile, seed): the limits and each variant's numbers and targets
    (``job_latency``: ``load_cost``'s)."""
    rows = []
    for prof in profiles:
        cost = load_cost(prof, job_latency)
        for seed in seeds:
            args = types.SimpleNamespace(workload="seed-mix", load=load, requests=requests,
                                         seed=seed, arrival="poisson", divisor=2)
            trace = build_trace(args, cost, devices, exact_load)
            lim = limits(trace, cost, devices)
            res = {v: simulate(v, trace, cost, devices, seed) for v in variants}
            row = {"profile": prof, "seed": seed, **lim, "policies": {}}
            for v, r in res.items():
                met = (targets({"slo": r, "fifo": res["fifo"]}, lim)
                       if "fifo" in res else [])
                row["policies"][v] = {
                    "slo_attainment": r["slo_attainment"], "p95_s": r["p95_s"],
                    "p99_s": r["p99_s"], "max_s": r["max_s"],
                    "targets_met": [ok for _, ok, _ in met]}
            rows.append(row)
            log.info("%s seed %d done", prof, seed)
    return rows


def tier_rows(profiles: list[str], seeds: list[int], spec: str, *, devices: int = 2,
              load: float = 0.8, requests: int = 150, side: int = 1024,
              exact_load: bool = True) -> list[dict]:
    """Per profile: the ``side``² tier of ``spec``'s records over ``seeds`` (see --tier)."""
    name, options = parse_variant(spec)
    out = []
    for prof in profiles:
        with open(RESULTS / f"demo_devices2_{prof}_profile.json") as f:
            cost = CostModel.from_dict(json.load(f))
        nc = NodeCost(cost)
        big, total, tail, tail_big = [], 0, 0, 0
        for seed in seeds:
            args = types.SimpleNamespace(workload="seed-mix", load=load, requests=requests,
                                         seed=seed, arrival="poisson", divisor=2)
            trace = build_trace(args, cost, devices, exact_load)
            topo = Node(devices, nc.links)
            policy = make_node_policy(name, NodeCost(cost), topo, **options)
            recs = simulate_node([dataclasses.replace(r) for r in trace], policy, topo,
                                 noise=TimingNoise(0.03, 0.0, seed)).records
            p95 = summarize(recs)["p95_s"]
            large = [r for r in recs if r.request.width * r.request.height >= side * side]
            total += len(recs)
            over = [r for r in recs if r.latency >= p95 - 1e-9]
            tail += len(over)
            tail_big += sum(r.request.width * r.request.height >= side * side for r in over)
            for r in large:
                q = r.request
                fixed = cost.encode_time(q) + cost.decode_time(q)
                one, two = nc.alone_step(q, 1), nc.alone_step(q, 2)
                alone2 = fixed + q.steps * two
                wait = r.started - q.arrival
                slow = r.degrees.get(1, 0) * (one - two)
                alive = any(o is not r and o.request.arrival < r.finished
                            and o.finished > q.arrival for o in large)
                big.append(dict(lat=r.latency, alone1=fixed + q.steps * one, alone2=alone2,
                                wait=wait, slow=slow, pause=r.latency - alone2 - wait - slow,
                                d1=r.degrees.get(1, 0), steps=q.steps, alone=not alive))
        n = max(1, len(big))
        out.append({
            "profile": prof, "share": len(big) / max(1, total), "tail_large": tail_big,
            "tail": tail, "requests": len(big),
            "alone1_s": big[0]["alone1"] if big else 0.0,
            "alone2_s": big[0]["alone2"] if big else 0.0,
            "within_bar": sum(b["lat"] <= 1.2 * b["alone2"] for b in big),
            **{f"mean_{k}": sum(b[k] for b in big) / n
               for k in ("wait", "slow", "pause", "d1", "steps")},
            "no_other_alive": sum(b["alone"] for b in big),
        })
    return out


def why_rows(profiles: list[str], seeds: list[int], specs: list[str], *, devices: int = 2,
             load: float = 0.8, requests: int = 150, side: int = 1024,
             large_only: bool = False, exact_load: bool = True) -> list[dict]:
    """Per variant: where the large requests' and the missed requests' time went (see --why),
    pooled over ``profiles`` × ``seeds``."""
    def large(q):
        return q.width * q.height >= side * side

    out = []
    for spec in specs:
        name, options = parse_variant(spec)
        big: dict[str, float] = {}
        miss: dict[str, float] = {}
        n_big = n_miss = within = 0
        miss_tiers: dict[int, int] = {}
        for prof in profiles:
            with open(RESULTS / f"demo_devices2_{prof}_profile.json") as f:
                cost = CostModel.from_dict(json.load(f))
            for seed in seeds:
                args = types.SimpleNamespace(workload="seed-mix", load=load, requests=requests,
                                             seed=seed, arrival="poisson", divisor=2)
                trace = build_trace(args, cost, devices, exact_load)
                bar = max(0.5 * simulate("fifo", trace, cost, devices, seed)["p95_s"],
                          1.2 * limits(trace, cost, devices)["p95_floor_s"])
                if large_only:
                    trace = [r for r in trace if large(r)]
                topo = Node(devices, NodeCost(cost).links)
                log = DecisionLog(make_node_policy(name, NodeCost(cost), topo, **options), large)
                recs = simulate_node([dataclasses.replace(r) for r in trace], log, topo,
                                     noise=TimingNoise(0.03, 0.0, seed)).records
                for pool, pick, until in ((big, lambda r: large(r.request), None),
                                          (miss, lambda r: not r.met,
                                           lambda r: r.request.deadline)):
                    for split in time_split(log.log, recs, pick, until).values():
                        for k, v in split.items():
                            pool[k] = pool.get(k, 0.0) + v
                n_big += sum(large(r.request) for r in recs)
                within += sum(large(r.request) and r.latency <= bar for r in recs)
                for r in recs:
                    if not r.met:
                        n_miss += 1
                        miss_tiers[r.request.width] = miss_tiers.get(r.request.width, 0) + 1
        out.append({
            "variant": spec, "large_only": large_only, "large": n_big,
            "large_within_bar": within, "missed": n_miss,
            "missed_by_side": dict(sorted(miss_tiers.items())),
            "large_s": {k: v / max(1, n_big)
                        for k, v in sorted(big.items(), key=lambda kv: -kv[1])},
            "missed_s": {k: v / max(1, n_miss)
                         for k, v in sorted(miss.items(), key=lambda kv: -kv[1])},
        })
    return out


def print_why(rows: list[dict]) -> None:
    for r in rows:
        only = " (large requests only)" if r["large_only"] else ""
        print(f"{r['variant']}{only}: {r['large_within_bar']}/{r['large']} large within the bar;"
              f" {r['missed']} missed {r['missed_by_side']}")
        for title, key in (("per large request", "large_s"),
                           ("per missed request, to its deadline", "missed_s")):
            if r[key]:
                print(f"  {title} (s): " + ", ".join(
                    f"{k} {v:.2f}" for k, v in r[key].items() if v >= 0.005))


def print_tier(rows: list[dict]) -> None:
    print(f"{'profile':8} {'share':>6} {'tail':>7} {'alone1':>6} {'alone2':>6} {'in bar':>8} "
          f"{'wait':>5} {'d1 cost':>7} {'pauses':>6} {'d1 steps':>9} {'alone':>8}")
    for r in rows:
        print(f"{r['profile']:8} {100 * r['share']:5.1f}% {r['tail_large']:3d}/{r['tail']:<3d} "
              f"{r['alone1_s']:6.2f} {r['alone2_s']:6.2f} "
              f"{r['within_bar']:3d}/{r['requests']:<4d} {r['mean_wait']:5.2f} "
              f"{r['mean_slow']:7.2f} {r['mean_pause']:6.2f} "
              f"{r['mean_d1']:4.1f}/{r['mean_steps']:<4.0f} "
              f"{r['no_other_alive']:3d}/{r['requests']:<4d}")


def print_table(rows: list[dict], variants: list[str]) -> None:
    head = f"{'profile':8} {'seed':>4} {'bound':>6} {'floor':>6} | " + " | ".join(
        f"{v[:26]:^26}" for v in variants)
    print(head)
    print(" " * 29 + "| " + " | ".join(f"{'att%':>6} {'P95':>5} {'P99':>5} {'tgt':>7}"
                                      for _ in variants))
    for row in rows:
        cells = []
        for v in variants:
            p = row["policies"][v]
            tgt = "".join("y" if ok else "-" for ok in p["targets_met"])
            cells.append(f"{100 * p['slo_attainment']:6.1f} {p['p95_s']:5.2f} "
                         f"{p['p99_s']:5.2f} {tgt:>7}")
        print(f"{row['profile']:8} {row['seed']:4d} {100 * row['bound_attainment']:6.1f} "
              f"{row['p95_floor_s']:6.2f} | " + " | ".join(cells))
    n = len(rows)
    print(f"\ntraces meeting each target (of {n}): attainment / P95 / P99 / all three;"
          " mean attainment, mean P95 / fifo's")
    for v in variants:
        met = [row["policies"][v]["targets_met"] for row in rows]
        if not met or not met[0]:
            continue
        counts = [sum(m[i] for m in met) for i in range(3)]
        every = sum(all(m) for m in met)
        att = sum(row["policies"][v]["slo_attainment"] for row in rows) / n
        ratio = sum(row["policies"][v]["p95_s"] / row["policies"]["fifo"]["p95_s"]
                    for row in rows) / n
        print(f"  {v:34} {counts[0]:3d} {counts[1]:3d} {counts[2]:3d} {every:3d}"
              f"   {100 * att:6.2f} %  {ratio:5.2f} x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-9", help="trace seeds, e.g. 0-9 or 0,3,5")
    ap.add_argument("--profiles", default="run6,run5,run3,run2,run1",
                    help="saved demo profiles (demo_devices2_<name>_profile.json)")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS,
                    help="policy[:option=value,...] comma-separated; ';' between variants "
                         "when options are given for several")
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--job-latency", type=float, metavar="S",
                    help="set each profile's links.job_latency_s to S seconds (a job's fixed "
                         "cost besides its stages; default: the profile's, 0 when absent)")
    ap.add_argument("--tier", metavar="VARIANT",
                    help="instead: what sets this variant's P95 (the 1024² tier; see above)")
    ap.add_argument("--why", metavar="VARIANTS",
                    help="instead: where the large and the missed requests' time went "
                         "(';' between variants; see above)")
    ap.add_argument("--large-only", action="store_true",
                    help="with --why: replay only each trace's 1024² requests")
    ap.add_argument("--as-drawn", action="store_true",
                    help="replay each trace as drawn, not scaled to the exact load (the demo "
                         "before session 17; reproduces the earlier tables)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.why:
        rows = why_rows(args.profiles.split(","), parse_seeds(args.seeds), args.why.split(";"),
                        load=args.load, requests=args.requests, large_only=args.large_only,
                        exact_load=not args.as_drawn)
        print_why(rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"why": rows}, f, indent=2)
        return 0
    if args.tier:
        rows = tier_rows(args.profiles.split(","), parse_seeds(args.seeds), args.tier,
                         load=args.load, requests=args.requests, exact_load=not args.as_drawn)
        print_tier(rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"tier": args.tier, "rows": rows}, f, indent=2)
        return 0
    sep = ";" if ";" in args.variants else None
    variants = args.variants.split(sep) if sep else _split_plain(args.variants)
    if "fifo" not in variants:
        variants.insert(0, "fifo")
    rows = run(args.profiles.split(","), parse_seeds(args.seeds), variants, load=args.load,
               requests=args.requests, job_latency=args.job_latency,
               exact_load=not args.as_drawn)
    print_table(rows, variants)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"variants": variants, "load": args.load, "requests": args.requests,
                       "rows": rows}, f, indent=2)
        print(f"json: {args.json}")
    return 0


def _split_plain(text: str) -> list[str]:
    """Split on commas that start a new variant (a part without ``=`` after a ``:``)."""
    out: list[str] = []
    for part in text.split(","):
        if out and "=" in part and ":" in out[-1]:
            out[-1] += "," + part
        else:
            out.append(part)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
