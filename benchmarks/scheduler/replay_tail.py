"""slo's tail on the saved one-device demo traces at true times slower than the profile
(issue 13): fifo (inline decode, as the demo runs it) beside slo settings (tiled decode),
the same traces, noise seeds and biases for every row.

    python benchmarks/scheduler/replay_tail.py --demo RUN.json ... [--bias 0 --bias 0.1]
        [--noise-seeds 3] [--fresh 5] [--setting LABEL=KEY:VALUE,...] [--json OUT]

Each ``--demo`` (a ``ditmem demo --json`` file with ``RUN_profile.json`` beside it) gives its
saved trace (``replay_bench.demo_trace``) under ``--noise-seeds`` noise seeds (0..N-1) and
``--fresh`` fresh traces of the same demo (its seed + 1..N, noise seed 0). Every trace runs
at each ``--bias`` (``TimingNoise(bias=B)``: true times (1 + B) × the profile's, σ 3 %)
under fifo and each setting; the clairvoyant batch-1 reference is computed on the trace
re-priced at that speed (``run_speed.scale_profile``, every kind × (1 + B)). Rows "default"
(today's slo), "late tiles" (``late_tile_margin=0.2``) and "late tiles + arrival" (also
``late_rank="arrival"``) — the session-9 options, off by default — are
always there. The summary per (saved / fresh, bias, setting):
mean attainment, the clairvoyant's mean, mean and largest P99 ÷ fifo's P99 (per run),
how many runs have P99 > fifo's, mean P95 ÷ fifo's and max ÷ fifo's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_bench import demo_trace, parse_setting, saved_demo  # noqa: E402

from ditmem.scheduler import CostModel  # noqa: E402
from ditmem.scheduler.bound import clairvoyant_misses  # noqa: E402
from ditmem.scheduler.metrics import summarize  # noqa: E402
from ditmem.scheduler.noise import DEFAULT_SIGMA, TimingNoise  # noqa: E402
from ditmem.scheduler.policies import make_policy  # noqa: E402
from ditmem.scheduler.simulator import simulate  # noqa: E402
from ditmem.tools.run_speed import KINDS, as_run, scale_profile  # noqa: E402

#: the session-9 options (off by default): late tiles in on-time slack, late requests oldest first
LATE_TILES = {"late_tile_margin": 0.2}
LATE_TILES_ARRIVAL = {"late_tile_margin": 0.2, "late_rank": "arrival"}


def clairvoyant(reqs, cost: CostModel, bias: float) -> float:
    """Clairvoyant batch-1 attainment on ``reqs`` with every time × (1 + ``bias``)."""
    run_cost = CostModel(scale_profile(cost.profile, {k: 1.0 + bias for k in KINDS}))
    return 1 - clairvoyant_misses(as_run(reqs, run_cost), run_cost) / len(reqs)


def one(reqs, cost: CostModel, policy: str, options: dict, decode: str, noise: TimingNoise):
    """One simulation's summary (``metrics.summarize``)."""
    pol = make_policy(policy, cost.fresh(), **options)
    result = simulate([dataclasses.replace(r) for r in reqs], pol, decode=decode, noise=noise)
    return summarize(result.records)


def rows_for(path: str, settings, biases, noise_seeds: int, fresh: int, sigma: float):
    """Rows (dicts) for every trace of the demo in ``path`` (module docstring)."""
    runs, cost = saved_demo(path)
    first = next(iter(runs.values()))
    name = path.rsplit("/", 1)[-1].removesuffix(".json")
    out = []
    for k, seed in [(0, s) for s in range(noise_seeds)] + [(k, 0) for k in range(1, fresh + 1)]:
        reqs = demo_trace(dict(first, seed=first["seed"] + k), cost)
        for bias in biases:
            noise = TimingNoise(sigma=sigma, seed=seed, bias=bias)
            fifo = one(reqs, cost, "fifo", {}, first["decode"].get("fifo", "inline"), noise)
            ref = clairvoyant(reqs, cost, bias)
            for label, policy, options in settings:
                noise = TimingNoise(sigma=sigma, seed=seed, bias=bias)
                s = one(reqs, cost, policy, options, first["decode"].get(policy, "inline"),
                        noise)
                out.append(dict(
                    trace=name, fresh=k, noise_seed=seed, bias=bias, setting=label,
                    options=options, attainment=s["slo_attainment"], clairvoyant=ref,
                    p95_s=s["p95_s"], p99_s=s["p99_s"], max_s=s["max_s"],
                    fifo_attainment=fifo["slo_attainment"], fifo_p95_s=fifo["p95_s"],
                    fifo_p99_s=fifo["p99_s"], fifo_max_s=fifo["max_s"]))
    return out


def summary(rows: list[dict], settings, biases) -> list[dict]:
    """Per (saved / fresh, bias, setting): the means and counts of the module docstring."""
    out = []
    for saved in (True, False):
        for bias in biases:
            for label, _, _ in settings:
                sel = [r for r in rows if (r["fresh"] == 0) == saved and r["bias"] == bias
                       and r["setting"] == label]
                if not sel:
                    continue
                p99 = [r["p99_s"] / r["fifo_p99_s"] for r in sel]
                out.append(dict(
                    traces="saved" if saved else "fresh", bias=bias, setting=label, runs=len(sel),
                    attainment=statistics.mean(r["attainment"] for r in sel),
                    clairvoyant=statistics.mean(r["clairvoyant"] for r in sel),
                    p99_over_fifo_mean=statistics.mean(p99), p99_over_fifo_max=max(p99),
                    p99_above_fifo=sum(x > 1 for x in p99),
                    p95_over_fifo_mean=statistics.mean(r["p95_s"] / r["fifo_p95_s"] for r in sel),
                    max_over_fifo_mean=statistics.mean(r["max_s"] / r["fifo_max_s"] for r in sel)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", action="append", required=True)
    ap.add_argument("--bias", type=float, action="append")
    ap.add_argument("--noise-seeds", type=int, default=3)
    ap.add_argument("--fresh", type=int, default=0)
    ap.add_argument("--noise", type=float, default=DEFAULT_SIGMA)
    ap.add_argument("--setting", action="append", default=[],
                    help="extra slo row LABEL=KEY:VALUE,... (repeatable)")
    ap.add_argument("--json", help="write the rows and the summary here")
    args = ap.parse_args()
    biases = args.bias or [0.0]
    settings = [("default", "slo", {}), ("late tiles", "slo", LATE_TILES),
                ("late tiles + arrival", "slo", LATE_TILES_ARRIVAL)]
    settings += [parse_setting(s) for s in args.setting]
    rows = []
    for path in args.demo:
        rows += rows_for(path, settings, biases, args.noise_seeds, args.fresh, args.noise)
    table = summary(rows, settings, biases)
    print(f"{'traces':<6} {'true':>5} {'setting':<22} {'runs':>4} {'att %':>6} {'clairv':>6} "
          f"{'P99/f':>6} {'max':>6} {'>f':>3} {'P95/f':>6} {'max/f':>6}")
    for t in table:
        print(f"{t['traces']:<6} x{1 + t['bias']:.2f} {t['setting']:<22} {t['runs']:4d} "
              f"{100 * t['attainment']:6.2f} {100 * t['clairvoyant']:6.2f} "
              f"{t['p99_over_fifo_mean']:6.3f} {t['p99_over_fifo_max']:6.3f} "
              f"{t['p99_above_fifo']:3d} {t['p95_over_fifo_mean']:6.3f} "
              f"{t['max_over_fifo_mean']:6.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"demos": args.demo, "biases": biases, "noise": args.noise,
                       "summary": table, "rows": rows}, fh, indent=1)
        print(f"json: {args.json}")


if __name__ == "__main__":
    main()
