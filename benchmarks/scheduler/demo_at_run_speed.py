"""Replay saved ``ditmem demo`` runs in the simulator at the speed each run actually had.

A demo builds its trace and deadlines from the profile it measures at start; its accuracy
report (``vs_profile``, ``work_load`` in the run's JSON) says how much slower or faster the
run's own work was. This replays each run's trace on its profile twice per policy, side by
side: as the demo predicted it (bias 0) and with the simulator's timing bias set to what the
run measured (``work_load / load - 1``, per policy), noise on both times. Where the second row
matches the real run, the run's result is explained by its speed, not by the policy. A third
row per policy is what the demos now print themselves (``ditmem.tools.run_speed``): the
device's times scaled per kind (steps, encodes, decodes, moves) by the run's own ratios, with
the clairvoyant reference and the offline bound on the same trace at that speed.

    python benchmarks/scheduler/demo_at_run_speed.py \\
        benchmarks/serving/results/demo_s7_run{1,2,3}.json --json OUT.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_bench import demo_trace, saved_demo  # noqa: E402

from ditmem.scheduler.metrics import summarize  # noqa: E402
from ditmem.scheduler.noise import DEFAULT_SIGMA, TimingNoise  # noqa: E402
from ditmem.scheduler.policies import make_policy  # noqa: E402
from ditmem.scheduler.simulator import simulate  # noqa: E402
from ditmem.tools.run_speed import one_device_references, speed_factors  # noqa: E402

log = logging.getLogger("demo_at_run_speed")

#: the demo's default pool (``--pool-mb 64`` of ``--page-kb 64`` pages; the JSON has no pool)
DEMO_PAGE_BYTES, DEMO_POOL_PAGES = 64 * 1024, 1024


def replay(path: str, sigma: float) -> list[dict]:
    """Rows for one saved demo run: per policy, the real run, the prediction, the replay at
    the run's speed (attainment in [0, 1], latencies in s)."""
    runs, cost = saved_demo(path)
    first = next(iter(runs.values()))
    reqs = demo_trace(first, cost)
    rows = []
    for policy, run in runs.items():
        if "work_load" not in run:
            raise ValueError(f"{path}: the {policy} row has no work_load (a run before the "
                             "accuracy report); nothing to replay at its speed")
        real = {k: run[k] for k in ("slo_attainment", "p95_s", "p99_s", "max_s")}
        rows.append(dict(run=path, policy=policy, case="real", bias=None,
                         clairvoyant=run.get("clairvoyant_attainment"), **real))
        speed = run["work_load"] / run["load"] - 1
        for case, bias in (("predicted", 0.0), ("at run speed", speed)):
            result = simulate([dataclasses.replace(r) for r in reqs],
                              make_policy(policy, cost.fresh()),
                              decode=first["decode"].get(policy, "inline"),
                              noise=TimingNoise(sigma=sigma, seed=0, bias=bias))
            s = summarize(result.records)
            rows.append(dict(run=path, policy=policy, case=case, bias=bias,
                             **{k: s[k] for k in real}))
        ref = one_device_references(reqs, cost.profile, speed_factors(run["vs_profile"]),
                                    policy, DEMO_PAGE_BYTES, DEMO_POOL_PAGES,
                                    first["decode"].get(policy, "inline"))
        rows.append(dict(run=path, policy=policy, case="per kind", bias=None,
                         clairvoyant=ref["clairvoyant_attainment"],
                         bound=ref["bound_attainment"], factors=ref["factors"],
                         slo_attainment=ref["sim_slo_attainment"], p95_s=ref["sim_p95_s"],
                         p99_s=ref["sim_p99_s"], max_s=None))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="demo JSON files (with *_profile.json beside)")
    ap.add_argument("--noise", type=float, default=DEFAULT_SIGMA)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = [row for path in args.runs for row in replay(path, args.noise)]
    log.info("%-32s %-6s %-13s %7s %8s %7s %7s %7s %8s", "run", "policy", "case", "bias",
             "att %", "P95 s", "P99 s", "max s", "clairv %")
    for r in rows:
        bias = "" if r["bias"] is None else f"{r['bias']:+.3f}"
        mx = "-" if r["max_s"] is None else f"{r['max_s']:.2f}"
        cv = "-" if r.get("clairvoyant") is None else f"{100 * r['clairvoyant']:.1f}"
        log.info("%-32s %-6s %-13s %7s %8.1f %7.2f %7.2f %7s %8s", Path(r["run"]).name,
                 r["policy"], r["case"], bias, 100 * r["slo_attainment"], r["p95_s"],
                 r["p99_s"], mx, cv)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
