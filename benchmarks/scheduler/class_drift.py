"""How robust ``slo`` is to class drift: true times biased by kind of work and by shape class
(``TimingNoise.bias_by``), beside fifo and the offline references, timing noise on (σ 3 %).

    python benchmarks/scheduler/class_drift.py [--part demo,seed-mix,node,node-mix]
        [--noise-seeds 3] [--seeds 0-2] [--requests 2000] [--node-seeds 0-4] [--json OUT]

Parts (each a table; ``--json`` writes every row):

* ``demo``: the 12 saved one-device demo traces (``replay_bench.saved_demo`` /
  ``demo_trace``: benchmarks/serving/results/demo_s{5,6,6_edf,7}_run{1,2,3}.json), each under
  noise seeds 0..N-1; fifo with inline decodes, slo with tiled ones (as the demo runs them).
* ``seed-mix``: seed-mix on h200 at ρ 0.8, ``--requests`` per seed, ``--seeds``; both
  policies with inline decodes (as ``ditmem sim``); the noise seed is the trace seed.

  Settings: ``uniform`` (bias 0), the trace's largest tier ×1.10 and ×1.20 and its smallest
  tier ×1.20 (``step:WxH`` and ``decode:WxH``: its steps — a packed step takes its largest
  member's class — and its decodes; encodes do not depend on the shape), and as a control
  ``all x1.20`` (every step and decode ×1.20: no class drift). Beside each: the offline
  bound (``bound.min_misses``, profile work) and the clairvoyant batch-1 reference
  (``bound.clairvoyant_misses``) on the trace re-priced at the setting's mean true times. The
  bound stays sound under the largest-member rule: a request's step share is scaled by the
  least factor of any class at least its size (a step it is in is priced by its largest
  member). Deadlines stay the profile's (as the real runs: the profile is what the server
  knows).
* ``node``: the session-10 two-device demo's trace (its saved profile
  benchmarks/parallel/results/demo_devices2_s10_profile.json; seed-mix ÷ 2, ρ 0.8, 150
  requests, seed 0: ``node_demo.build_trace``) under noise seeds ``--node-seeds``;
  ``node-mix``: seed-mix on 8 × h200 at ρ 0.8 (per device), ``--requests`` × ``--seeds``.
  fifo on static single-device replicas beside slo. Settings: ``uniform``; ``s10 drift``
  (what that run measured and the brief names: moves ×2.42, encodes ×1.29, degree-2 steps
  ×0.90); ``s10 all`` (every factor that run measured for slo: also decodes ×0.885,
  degree-1 steps ×0.986); the largest and the smallest tier ×1.20 (steps and decodes).
  Beside each per-kind setting: the node bound and clairvoyant reference on the profile
  re-priced at it (``run_speed.scale_profile``; deadlines stay the profile's).

Per setting and policy: mean attainment, p0 attainment, P95 and P99 (the demo: means over the
runs, and the mean of per-run ratios to fifo's; seed-mix and node: pooled over seeds), the
references, per-tier attainment, and for slo the requests it met at ``uniform`` but misses
under the drift (same trace and noise seed: the draws' z are common to all settings), by
tier, with their preemptions then and now.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_bench import demo_trace, saved_demo  # noqa: E402

from ditmem.scheduler import CostModel  # noqa: E402
from ditmem.scheduler.bound import clairvoyant_misses, min_misses  # noqa: E402
from ditmem.scheduler.metrics import summarize  # noqa: E402
from ditmem.scheduler.node.bound import clairvoyant_node_misses, min_node_misses  # noqa: E402
from ditmem.scheduler.node.cost import NodeCost  # noqa: E402
from ditmem.scheduler.node.policies import make_node_policy  # noqa: E402
from ditmem.scheduler.node.simulator import simulate_node  # noqa: E402
from ditmem.scheduler.node.topology import Node  # noqa: E402
from ditmem.scheduler.noise import DEFAULT_SIGMA, TimingNoise, shape_class  # noqa: E402
from ditmem.scheduler.policies import make_policy  # noqa: E402
from ditmem.scheduler.simulator import simulate  # noqa: E402
from ditmem.scheduler.workloads import workload  # noqa: E402
from ditmem.tools.node_demo import build_trace  # noqa: E402
from ditmem.tools.run_speed import scale_profile  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMOS = [ROOT / f"benchmarks/serving/results/demo_{s}_run{k}.json"
         for s in ("s5", "s6", "s6_edf", "s7") for k in (1, 2, 3)]
NODE_PROFILE = ROOT / "benchmarks/parallel/results/demo_devices2_s10_profile.json"
#: the session-10 two-device run's measured factors (slo row's ``vs_profile``)
S10_DRIFT = {"move": 1.42, "encode": 0.29, "step:d2": -0.10}
S10_ALL = {**S10_DRIFT, "decode": -0.115, "step:d1": -0.014}
PARTS = ("demo", "seed-mix", "node", "node-mix")
log = logging.getLogger("class_drift")


def size(r) -> int:
    return r.width * r.height * r.frames


def tiers(reqs) -> list[str]:
    """The trace's shape classes, smallest first."""
    by = {shape_class(r): size(r) for r in reqs}
    return sorted(by, key=by.get)


def one_device_settings(reqs) -> list[tuple[str, dict]]:
    """(label, bias_by) of the one-device settings for this trace (module docstring)."""
    small, large = tiers(reqs)[0], tiers(reqs)[-1]

    def tier(cls, b):
        return {f"step:{cls}": b, f"decode:{cls}": b}

    return [("uniform", {}), ("largest x1.10", tier(large, 0.10)),
            ("largest x1.20", tier(large, 0.20)), ("smallest x1.20", tier(small, 0.20)),
            ("all x1.20", {k: 0.20 for k in ("step", "decode")})]


class DriftedCost:
    """``cost`` as ``min_misses`` sees it at a drift's mean true times (module docstring):
    encodes and decodes × their class's factor, a step share × the least factor of a class
    at least the request's size among ``reqs``."""

    def __init__(self, cost: CostModel, noise: TimingNoise, reqs):
        self.cost, self.noise = cost, noise
        shapes = {shape_class(r): size(r) for r in reqs}
        self.floor = {}
        for r in reqs:
            n = cost.tokens(r)
            self.floor[n] = min(noise.factor("step", c) for c, s in shapes.items()
                                if s >= size(r))

    def __getattr__(self, name):
        return getattr(self.cost, name)

    def profile_step_share(self, model, tokens, lo, hi):
        return self.cost.profile_step_share(model, tokens, lo, hi) * self.floor[tokens]

    def min_step_share(self, model, tokens):
        return self.cost.min_step_share(model, tokens) * self.floor[tokens]

    def encode_time(self, r):
        return self.cost.encode_time(r) * self.noise.factor("encode", shape_class(r))

    def decode_time(self, r):
        return self.cost.decode_time(r) * self.noise.factor("decode", shape_class(r))


def at_drift(reqs, cost: CostModel, noise: TimingNoise) -> list:
    """Copies of ``reqs`` whose ``standalone_s`` is their batch-1 time at ``noise``'s mean
    true times (deadlines kept)."""
    out = []
    for r in reqs:
        cls = shape_class(r)
        step = cost.step_time(r.model, [cost.tokens(r)]) * noise.factor("step", cls)
        alone = (cost.encode_time(r) * noise.factor("encode", cls) + r.steps * step
                 + cost.decode_time(r) * noise.factor("decode", cls))
        out.append(dataclasses.replace(r, standalone_s=alone))
    return out


def references(reqs, cost: CostModel, bias_by: dict) -> dict:
    """The offline bound and the clairvoyant batch-1 attainment at the drift's mean times."""
    noise = TimingNoise(0.0, 0.0, 0, bias_by)
    run = at_drift(reqs, cost, noise)
    n = len(reqs)
    return {"bound": 1 - min_misses(run, DriftedCost(cost, noise, reqs)) / n,
            "clairvoyant": 1 - clairvoyant_misses(run, cost) / n}


def tier_attainment(records) -> dict[str, float]:
    out: dict[str, list[bool]] = {}
    for rec in records:
        out.setdefault(shape_class(rec.request), []).append(rec.met)
    return {k: sum(v) / len(v) for k, v in out.items()}


def p0(summary: dict) -> float | None:
    return summary["per_priority"]["0"]["slo_attainment"]


def sim_one(reqs, cost, policy, decode, noise):
    pol = make_policy(policy, cost.fresh())
    return simulate([dataclasses.replace(r) for r in reqs], pol, decode=decode,
                    noise=noise).records


def lost(base, now) -> list[dict]:
    """Requests met in ``base`` and missed in ``now`` (records of one trace, by id)."""
    before = {r.request.id: r for r in base}
    out = []
    for r in now:
        b = before[r.request.id]
        if b.met and not r.met:
            out.append({"id": r.request.id, "tier": shape_class(r.request),
                        "priority": r.request.priority, "late_s": r.finished - r.request.deadline,
                        "preemptions_before": b.preemptions, "preemptions": r.preemptions,
                        "wait_before_s": b.started - b.request.arrival,
                        "wait_s": r.started - r.request.arrival})
    return out


# ---- one device ------------------------------------------------------------------------
def one_device_traces(part: str, args):
    """(name, requests, cost, decode by policy, noise seed) per run of ``part``."""
    if part == "demo":
        for path in DEMOS:
            runs, cost = saved_demo(str(path))
            first = next(iter(runs.values()))
            reqs = demo_trace(first, cost)
            for seed in range(args.noise_seeds):
                yield path.stem, reqs, cost, first["decode"], seed
    else:
        cost = CostModel.load("h200")
        for seed in args.seeds:
            reqs = workload("seed-mix", cost, load=0.8, requests=args.requests, seed=seed,
                            arrival=getattr(args, "arrival", "poisson"))
            yield f"seed-mix s{seed}", reqs, cost, {}, seed


def one_device(part: str, args) -> list[dict]:
    """One row per (run, setting, policy) with the run's references (module docstring)."""
    rows = []
    for name, reqs, cost, decode, seed in one_device_traces(part, args):
        t0 = time.time()
        base: dict[str, list] = {}
        for k, (label, by) in enumerate(one_device_settings(reqs)):
            ref = references(reqs, cost, by)
            for policy in ("fifo", "slo"):
                recs = sim_one(reqs, cost, policy, decode.get(policy, "inline"),
                               TimingNoise(args.sigma, 0.0, seed, by))
                s = summarize(recs)
                if k == 0:
                    base[policy] = recs
                rows.append(dict(part=part, trace=name, noise_seed=seed, setting_index=k,
                                 setting=label, bias_by=by, policy=policy, **ref,
                                 attainment=s["slo_attainment"], p0=p0(s), p95_s=s["p95_s"],
                                 p99_s=s["p99_s"], max_s=s["max_s"],
                                 preemptions=s["preemptions"], tiers=tier_attainment(recs),
                                 records=recs, lost=lost(base[policy], recs) if k else []))
        log.info("%s noise %d: %.1f s", name, seed, time.time() - t0)
    return rows


def pooled(rows: list[dict]) -> dict:
    """Pooled summary of the rows' records (one setting and policy over seeds)."""
    recs = [r for row in rows for r in row["records"]]
    s = summarize(recs)
    return dict(attainment=s["slo_attainment"], p0=p0(s), p95_s=s["p95_s"], p99_s=s["p99_s"],
                max_s=s["max_s"], tiers=tier_attainment(recs))


def one_device_table(part: str, rows: list[dict]) -> list[dict]:
    out = []
    for k in sorted({r["setting_index"] for r in rows}):
        sel = [r for r in rows if r["setting_index"] == k]
        fifo = [r for r in sel if r["policy"] == "fifo"]
        slo = [r for r in sel if r["policy"] == "slo"]
        pairs = list(zip(fifo, slo, strict=True))
        t = dict(part=part, setting=sel[0]["setting"],
                 drifted=sorted({key for r in slo for key in r["bias_by"]}), runs=len(slo),
                 bound=statistics.mean(r["bound"] for r in slo),
                 clairvoyant=statistics.mean(r["clairvoyant"] for r in slo))
        for label, group in (("fifo", fifo), ("slo", slo)):
            if part == "demo":
                t[label] = dict(
                    attainment=statistics.mean(r["attainment"] for r in group),
                    p0=statistics.mean(r["p0"] for r in group if r["p0"] is not None),
                    p95_s=statistics.mean(r["p95_s"] for r in group),
                    p99_s=statistics.mean(r["p99_s"] for r in group),
                    max_s=statistics.mean(r["max_s"] for r in group))
            else:
                t[label] = pooled(group)
        t["p95_over_fifo"] = statistics.mean(s["p95_s"] / f["p95_s"] for f, s in pairs)
        t["p99_over_fifo"] = statistics.mean(s["p99_s"] / f["p99_s"] for f, s in pairs)
        t["slo_lost"] = [x for r in slo for x in r["lost"]]
        out.append(t)
    return out


def print_one_device(table: list[dict]) -> None:
    print(f"\n{table[0]['part']}: {table[0]['runs']} runs per setting, noise σ 3 %")
    print(f"{'setting':<16} {'bound':>6} {'clairv':>6} | {'fifo att':>8} {'p0':>6} "
          f"{'P95':>7} {'P99':>7} | {'slo att':>7} {'p0':>6} {'P95':>7} {'P99':>7} "
          f"{'P95/f':>6} {'P99/f':>6} {'lost':>4}")
    for t in table:
        f, s = t["fifo"], t["slo"]
        print(f"{t['setting']:<16} {100 * t['bound']:6.2f} {100 * t['clairvoyant']:6.2f} | "
              f"{100 * f['attainment']:8.2f} {100 * f['p0']:6.2f} {f['p95_s']:7.2f} "
              f"{f['p99_s']:7.2f} | {100 * s['attainment']:7.2f} {100 * s['p0']:6.2f} "
              f"{s['p95_s']:7.2f} {s['p99_s']:7.2f} {t['p95_over_fifo']:6.3f} "
              f"{t['p99_over_fifo']:6.3f} {len(t['slo_lost']):4d}")
    for t in table[1:]:
        by: dict[str, list] = {}
        for x in t["slo_lost"]:
            by.setdefault(x["tier"], []).append(x)
        if by:
            parts = [f"{tier} {len(v)} (p0 {sum(x['priority'] == 0 for x in v)}, preempted "
                     f"{statistics.mean(x['preemptions_before'] for x in v):.1f} -> "
                     f"{statistics.mean(x['preemptions'] for x in v):.1f}, late "
                     f"{statistics.median(x['late_s'] for x in v):.2f} s median)"
                     for tier, v in sorted(by.items())]
            print(f"  slo lost under {t['setting']}: " + "; ".join(parts))


# ---- node ------------------------------------------------------------------------------
def node_settings(large: str, small: str) -> list[tuple[str, dict]]:
    return [("uniform", {}), ("s10 drift", S10_DRIFT), ("s10 all", S10_ALL),
            ("largest x1.20", {f"step:{large}": 0.2, f"decode:{large}": 0.2}),
            ("smallest x1.20", {f"step:{small}": 0.2, f"decode:{small}": 0.2})]


def node_references(traces, cost: CostModel, devices: int, by: dict) -> dict | None:
    """The node bound and clairvoyant reference (pooled over ``traces``) on the profile
    re-priced at a per-kind drift (``run_speed.scale_profile``; the deadlines stay the
    profile's). None: classes by shape, which a profile scaling cannot express."""
    kinds = {"move": "moves", "encode": "encodes", "decode": "decodes", "step:d1": "steps d1",
             "step:d2": "steps d2"}
    if any(k not in kinds for k in by):
        return None
    factors = {kinds[k]: 1.0 + v for k, v in by.items()}
    factors.setdefault("steps d1", 1.0)
    ncost = NodeCost(CostModel(scale_profile(cost.profile, factors)))
    degrees = Node(devices, ncost.links).degrees
    lower = clair = total = 0
    for trace in traces:
        run = [dataclasses.replace(r, standalone_s=ncost.cost.standalone_time(r)) for r in trace]
        lower += min_node_misses(run, ncost, devices, degrees)
        clair += clairvoyant_node_misses(run, ncost, devices)
        total += len(trace)
    return {"bound_attainment": 1 - lower / total, "clairvoyant_attainment": 1 - clair / total}


def node_runs(part: str, args):
    """(cost, devices, [(trace, noise seed)]) of a node part (module docstring)."""
    if part == "node":
        with open(NODE_PROFILE) as fh:
            cost = CostModel.from_dict(json.load(fh))
        ns = types.SimpleNamespace(workload="seed-mix", load=0.8, requests=150, seed=0,
                                   arrival="poisson", divisor=2)
        trace = build_trace(ns, cost, 2)
        return cost, 2, [(trace, seed) for seed in args.node_seeds]
    cost = CostModel.load("h200")
    return cost, 8, [(workload("seed-mix", cost, load=0.8 * 8, requests=args.requests,
                               seed=seed), seed) for seed in args.seeds]


def node_part(part: str, args) -> list[dict]:
    """One row per (setting, policy) of a node part, pooled over its runs."""
    cost, devices, runs = node_runs(part, args)
    shapes = tiers(runs[0][0])
    rows = []
    base: dict[str, list] = {}  # the uniform setting's records per policy, per run
    for k, (label, by) in enumerate(node_settings(shapes[-1], shapes[0])):
        ref = node_references(list({id(t): t for t, _ in runs}.values()), cost, devices, by)
        for policy in ("fifo", "slo"):
            recs_all = []
            for trace, seed in runs:
                topo = Node(devices, NodeCost(cost).links)
                pol = make_node_policy(policy, NodeCost(cost), topo)
                recs = simulate_node([dataclasses.replace(r) for r in trace], pol, topo,
                                     noise=TimingNoise(args.sigma, 0.0, seed, by)).records
                recs_all.append(recs)
            if k == 0:
                base[policy] = recs_all
            flat = [r for rs in recs_all for r in rs]
            s = summarize(flat)
            gone = [] if k == 0 else [x for b, n in zip(base[policy], recs_all, strict=True)
                                      for x in lost(b, n)]
            rows.append(dict(part=part, devices=devices, setting=label, bias_by=by,
                             policy=policy, limits=ref, attainment=s["slo_attainment"],
                             p0=p0(s), p95_s=s["p95_s"], p99_s=s["p99_s"], max_s=s["max_s"],
                             tiers=tier_attainment(flat), lost_count=len(gone),
                             lost=gone if policy == "slo" else []))
        log.info("%s %s done", part, label)
    return rows


def print_node(rows: list[dict], args) -> None:
    if rows[0]["part"] == "node":
        print(f"\nnode: the s10 two-device demo trace (150 requests) x noise seeds "
              f"{args.node_seeds}, pooled")
    else:
        print(f"\nnode-mix: seed-mix on 8 x h200, rho 0.8, {args.requests} requests x seeds "
              f"{args.seeds}, pooled; fifo = 8 static single-device replicas")
    print(f"{'setting':<22} {'bound':>6} {'clairv':>6} {'policy':<5} {'att':>7} {'p0':>7} "
          f"{'P95':>7} {'P99':>7} {'max':>7} {'lost':>4}  per tier")
    for r in rows:
        lim = r["limits"]
        b = f"{100 * lim['bound_attainment']:6.2f} {100 * lim['clairvoyant_attainment']:6.2f}" \
            if lim else f"{'-':>6} {'-':>6}"
        tiers_txt = " ".join(f"{k} {100 * v:.1f}" for k, v in sorted(r["tiers"].items()))
        print(f"{r['setting']:<22} {b} {r['policy']:<5} {100 * r['attainment']:7.2f} "
              f"{100 * r['p0']:7.2f} {r['p95_s']:7.2f} {r['p99_s']:7.2f} {r['max_s']:7.2f} "
              f"{r['lost_count']:4d}  {tiers_txt}")


def seeds_arg(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        out += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default=",".join(PARTS))
    ap.add_argument("--noise-seeds", type=int, default=3, help="demo: noise seeds per trace")
    ap.add_argument("--seeds", type=seeds_arg, default=[0, 1, 2], help="seed-mix trace seeds")
    ap.add_argument("--requests", type=int, default=2000, help="seed-mix requests per seed")
    ap.add_argument("--node-seeds", type=seeds_arg, default=list(range(5)))
    ap.add_argument("--noise", dest="sigma", type=float, default=DEFAULT_SIGMA)
    ap.add_argument("--json", help="write every table and row here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parts = [p.strip() for p in args.part.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"--part: unknown {bad}; choose from {', '.join(PARTS)}")
    out = {"noise": args.sigma, "command": " ".join(sys.argv)}
    for part in parts:
        if part in ("node", "node-mix"):
            rows = node_part(part, args)
            print_node(rows, args)
            out[part] = rows
            continue
        rows = one_device(part, args)
        table = one_device_table(part, rows)
        print_one_device(table)
        for r in rows:  # the records go; the lost requests are in the table
            del r["records"], r["lost"]
        out[part] = {"table": table, "rows": rows}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
        print(f"json: {args.json}")


if __name__ == "__main__":
    main()
