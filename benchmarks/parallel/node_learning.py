"""The two-device demo's trace when the devices drift from their start-up profile as the
real runs measured: does node ``slo`` learn it?

    python benchmarks/parallel/node_learning.py [--profiles s11_main1,s11_main2,s11_main3]
        [--seeds 0-4] [--json OUT]

Session 11's real two-device runs landed 1–3 points under their simulator at the run's
speed. Their per-kind factors (``at_run_speed``, main run 1): encodes ×2.37 the profile,
decodes ×1.11, moves ×2.09, degree-1 steps ×1.11, degree-2 steps ×1.20 — and by shape at
degree 2: 256² ×1.26, 512² ×1.21, 1024² ×1.12 (loop intervals). The settings below draw the
simulator's truth that way (``TimingNoise.bias_by``, σ 3 %) while the policy starts from
the profile and learns online only:

* ``none``: no drift (the control);
* ``kinds``: the per-kind factors;
* ``classes``: the per-kind factors with the per-shape ones on top of the steps'.

Per setting, for each ``--variants`` entry (default ``fifo``, two static replicas, and
``slo``): mean attainment, mean P95 and P99 over the (profile, seed) traces, and how many
traces meet ``slo`` ≥ 99 %. Run it on two
checkouts to compare two versions of the learning (the simulation is deterministic: the same
traces and draws in both).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))

from node_demo_sim import RESULTS, parse_seeds, simulate  # noqa: E402

from ditmem.scheduler import CostModel  # noqa: E402
from ditmem.tools.node_demo import build_trace  # noqa: E402

KINDS = {"encode": 1.37, "decode": 0.11, "move": 1.09, "step:d1": 0.11, "step:d2": 0.20}
#: on top of step:d2's 1.20: 1.26 / 1.21 / 1.12 (degree-1 steps of these shapes get it too)
CLASSES = {"step:256x256": 0.05, "step:512x512": 0.01, "step:1024x1024": -0.067}
SETTINGS = {"none": {}, "kinds": KINDS, "classes": {**KINDS, **CLASSES}}
POLICIES = ("fifo", "slo")  # the default of --variants
log = logging.getLogger("node_learning")


def run(profiles: list[str], seeds: list[int], variants=POLICIES) -> list[dict]:
    rows = []
    for prof in profiles:
        with open(RESULTS / f"demo_devices2_{prof}_profile.json") as f:
            cost = CostModel.from_dict(json.load(f))
        for seed in seeds:
            args = types.SimpleNamespace(workload="seed-mix", load=0.8, requests=150,
                                         seed=seed, arrival="poisson", divisor=2)
            trace = build_trace(args, cost, 2)
            for name, bias_by in SETTINGS.items():
                for policy in variants:
                    s = simulate(policy, trace, cost, 2, seed, bias_by)
                    rows.append({"profile": prof, "seed": seed, "setting": name,
                                 "policy": policy, "attainment": s["slo_attainment"],
                                 "p95_s": s["p95_s"], "p99_s": s["p99_s"]})
            log.info("%s seed %d done", prof, seed)
    return rows


def table(rows: list[dict], variants=POLICIES) -> list[dict]:
    out = []
    for name in SETTINGS:
        for policy in variants:
            sel = [r for r in rows if r["setting"] == name and r["policy"] == policy]
            out.append({
                "setting": name, "policy": policy, "traces": len(sel),
                "attainment": statistics.fmean(r["attainment"] for r in sel),
                "at_99": sum(r["attainment"] >= 0.99 for r in sel),
                "p95_s": statistics.fmean(r["p95_s"] for r in sel),
                "p99_s": statistics.fmean(r["p99_s"] for r in sel)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default="s11_main1,s11_main2,s11_main3",
                    help="saved demo profiles (demo_devices2_<name>_profile.json)")
    ap.add_argument("--seeds", default="0-4", help="trace seeds, e.g. 0-4 or 0,3")
    ap.add_argument("--variants", default=";".join(POLICIES),
                    help="';'-separated policy[:option=value,...] (default fifo;slo)")
    ap.add_argument("--json", help="write the rows and the table here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    variants = [v for v in args.variants.split(";") if v]
    rows = run(args.profiles.split(","), parse_seeds(args.seeds), variants)
    summary = table(rows, variants)
    print(f"{'setting':8} {'policy':20} {'traces':>6} {'att %':>7} {'>=99%':>5} "
          f"{'P95 s':>6} {'P99 s':>6}")
    for t in summary:
        print(f"{t['setting']:8} {t['policy']:20} {t['traces']:6d} {100 * t['attainment']:7.2f} "
              f"{t['at_99']:5d} {t['p95_s']:6.2f} {t['p99_s']:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "table": summary, "settings": SETTINGS}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
