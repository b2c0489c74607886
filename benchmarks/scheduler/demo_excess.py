"""How many requests ``slo`` misses beyond the clairvoyant reference on the one-device demo's
traces when the machine runs a little slower than the profile the demo measured at start —
the real demo's "within 1 point of the clairvoyant" criterion, per trace.

For each saved demo profile (``benchmarks/serving/results/<name>_profile.json``), each trace
seed and each speed factor f (the device's true times are the profile's × f, per kind:
steps, encodes, decodes, moves — ``ditmem.tools.run_speed.scale_profile``, as the demos'
own "at run speed" references), the demo's trace is rebuilt (seed-mix ÷ 2, 150 requests,
ρ 0.8 on the profile, deadlines 3 × the profile's standalone times) and replayed with the
device's truth drawn around the scaled profile (noise σ ``--noise``, default 3 %; the real
machine's small steps spread ~7–10 %: ``benchmarks/parallel/results/noise_fit_s14.json``;
noise seed = the trace seed),
while each setting of ``slo`` plans with the unscaled profile, decoding tile by tile as the
demo runs it. The clairvoyant reference (``bound.clairvoyant_misses``) is computed on the
same trace at the scaled times. Columns per setting: mean excess misses over the
clairvoyant's, traces within one point of it (≤ 1 excess miss of 150, the real target's
criterion), and the median P99 (s).

    python benchmarks/scheduler/demo_excess.py [--profiles demo_s18_run2,...] [--seeds 0-9]
        [--factors 1.0,1.03] [--setting LABEL=KEY:VALUE,...] [--noise 0.03] [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))

from class_drift import seeds_arg  # noqa: E402
from demo_prediction import demo_trace  # noqa: E402
from replay_bench import parse_setting  # noqa: E402

from ditmem.engine.factory import make_policy_and_cost  # noqa: E402
from ditmem.scheduler import CostModel  # noqa: E402
from ditmem.scheduler.bound import clairvoyant_misses  # noqa: E402
from ditmem.scheduler.metrics import summarize  # noqa: E402
from ditmem.scheduler.noise import DEFAULT_SIGMA, TimingNoise  # noqa: E402
from ditmem.scheduler.simulator import simulate  # noqa: E402
from ditmem.tools.run_speed import KINDS, as_run, scale_profile  # noqa: E402

log = logging.getLogger("demo_excess")
RESULTS = Path(__file__).resolve().parents[1] / "serving" / "results"


def replay(profile: str, factor: float, seeds: list[int],
           settings: list[tuple[str, dict]], sigma: float = DEFAULT_SIGMA) -> dict:
    """One (profile, speed factor) cell: per setting the excess misses of each trace."""
    base = CostModel.load(str(RESULTS / f"{profile}_profile.json"))
    run_cost = CostModel(scale_profile(base.profile, {k: factor for k in KINDS}))
    out = {label: {"excess": [], "p99_s": []} for label, _ in settings}
    for seed in seeds:
        trace = demo_trace(base, 2, 150, seed, 0.8, True)
        clair = clairvoyant_misses(as_run(trace, run_cost), run_cost)
        for label, options in settings:
            policy, _ = make_policy_and_cost("slo", CostModel(base.profile), options)
            sim = simulate([dataclasses.replace(r) for r in trace], policy, run_cost,
                           decode="tiled", noise=TimingNoise(sigma, 0.0, seed))
            out[label]["excess"].append(sum(not r.met for r in sim.records) - clair)
            out[label]["p99_s"].append(summarize(sim.records)["p99_s"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", default="demo_s18_run2,demo_s18_run3,demo_s17_run2",
                    help="saved demo runs (names under benchmarks/serving/results)")
    ap.add_argument("--seeds", type=seeds_arg, default=list(range(10)),
                    help="trace seeds: N, A-B, or a comma-separated list of those")
    ap.add_argument("--factors", default="1.0,1.03",
                    help="true times / the profile's (comma-separated)")
    ap.add_argument("--setting", action="append", default=[],
                    help="an slo row LABEL=KEY:VALUE,... besides the default (repeatable)")
    ap.add_argument("--noise", type=float, default=DEFAULT_SIGMA,
                    help=f"σ of the true times' lognormal jitter (default {DEFAULT_SIGMA})")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = [("default", {})]
    for text in args.setting:
        label, _, options = parse_setting(text)
        settings.append((label, options))
    seeds = args.seeds
    rows = []
    head = f"{'profile':15} {'f':>5}"
    for label, _ in settings:
        head += f" | {label[:14]:>14} {'excess':>6} {'<=1pt':>6} {'P99 s':>6}"
    log.info(head)
    for profile in args.profiles.split(","):
        for factor in (float(f) for f in args.factors.split(",")):
            cell = replay(profile, factor, seeds, settings, args.noise)
            line = f"{profile:15} {factor:5.2f}"
            for label, options in settings:
                ex, p99 = cell[label]["excess"], cell[label]["p99_s"]
                within = sum(e <= 1 for e in ex)
                line += (f" | {'':14} {statistics.mean(ex):6.2f} {within:3d}/{len(ex):<2d}"
                         f" {statistics.median(p99):6.1f}")
                rows.append({"profile": profile, "factor": factor, "setting": label,
                             "options": options, "seeds": seeds, "noise": args.noise,
                             "excess_misses": ex, "p99_s": p99})
            log.info(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        log.info("json: %s", args.json)


if __name__ == "__main__":
    main()
