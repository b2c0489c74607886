"""How noisy a real two-device run is, and whether that noise explains its gap to the simulator.

    python benchmarks/parallel/noise_fit.py fit RUN.json [RUN.json ...] --out FIT.json
    python benchmarks/parallel/noise_fit.py check --fit FIT.json RUN.json:PROFILE.json ...
        [--seeds 0-9] [--job-gap [median|mean]] [--json OUT]
    python benchmarks/parallel/noise_fit.py gaps RUN.json

``fit``: every single step, encode, decode and move a ``demo --devices --json`` run measured
(``job_timings``, both policies) as ``log(measured / predicted)``: per stage and class the
count, the median ratio, the spread (standard deviation of the log ratio, the simulator's
σ), the 95th / 99th percentile ratio over the median and the lag-1 autocorrelation in the
order the jobs completed; the pools (``ditmem.scheduler.noise.fit_residuals``) go to
``--out``.

``check``: per run (its JSON and the profile it measured at start) and policy, the run's
attainment / P95 / P99 beside the node simulator's replay of the same trace at the run's
measured speed (``ditmem.tools.run_speed.node_replay``) over ``--seeds`` noise seeds, with
the simulator's 3 % lognormal and with the fitted pools — mean and range over the seeds.
Where the fitted noise's range holds the run and the 3 % one does not, the gap was noise.
``--job-gap [median|mean]``: the replays' truth also pays each run's median (or mean) gap
per job (below) as its ``links.job_latency_s`` (``run_speed.job_gap``).

``gaps``: per policy and kind of job (its step stage and class, "+dec" for a last step with
its decode), the loop's span of each job (launch to last event, ``job_started_s`` /
``job_finished_s``) beside the sum of its stages as the workers measured them: jobs, both
sums, the gap per job (median, 95th percentile) and in all — the time the replay at the
run's speed never sees (it scales the profile by the stages' ratio).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))

from node_demo_sim import parse_seeds  # noqa: E402

log = logging.getLogger("noise_fit")


def job_rows(paths: list[str]) -> list[list]:
    """Every run's ``job_timings`` rows, run by run, policy by policy (completion order)."""
    rows = []
    for path in paths:
        with open(path) as f:
            for run in json.load(f):
                if "job_timings" not in run:
                    raise ValueError(f"{path}: no job_timings (a run before a32fcba?)")
                rows.extend(run["job_timings"]["rows"])
    return rows


def stats(rows: list[list]) -> list[dict]:
    """Per (stage, class) of single pieces of work: the figures of the module docstring."""
    groups: dict[tuple[str, str], list[float]] = {}
    for stage, cls, count, measured, predicted, *_ in rows:
        if count == 1 and measured > 0 and predicted > 0:
            groups.setdefault((stage, cls), []).append(math.log(measured / predicted))
    out = []
    for (stage, cls), v in sorted(groups.items()):
        s = sorted(v)

        def q(f: float, s=s) -> float:
            return s[round(f * (len(s) - 1))]

        lag = statistics.correlation(v[:-1], v[1:]) if len(v) > 3 and len(set(v)) > 1 else 0.0
        out.append({"stage": stage, "class": cls, "jobs": len(v), "median": math.exp(q(0.5)),
                    "sigma": statistics.pstdev(v), "p95_over_median": math.exp(q(0.95) - q(0.5)),
                    "p99_over_median": math.exp(q(0.99) - q(0.5)), "lag1": lag})
    return out


def print_stats(rows: list[dict]) -> None:
    print(f"{'stage':<10} {'class':<16} {'jobs':>5} {'median':>7} {'sigma':>6} "
          f"{'p95/med':>8} {'p99/med':>8} {'lag1':>5}")
    for r in rows:
        print(f"{r['stage']:<10} {r['class']:<16} {r['jobs']:>5} {r['median']:>7.3f} "
              f"{r['sigma']:>6.3f} {r['p95_over_median']:>8.2f} {r['p99_over_median']:>8.2f} "
              f"{r['lag1']:>5.2f}")


def check_run(run_path: str, profile_path: str, residuals: dict, seeds: list[int],
              job_gap: str | None = None) -> list[dict]:
    """Per policy of the run: its figures and the replays' (module docstring); ``job_gap``
    ("median" or "mean"): the truth's ``links.job_latency_s`` is that statistic of the
    policy's run's gaps per job (``run_speed.job_gap``; None: the profile's)."""
    from ditmem.scheduler import CostModel
    from ditmem.scheduler.metrics import summarize
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.tools.node_demo import rebuild_trace
    from ditmem.tools.run_speed import job_gap as run_gap
    from ditmem.tools.run_speed import node_replay, scale_profile

    with open(run_path) as f:
        runs = json.load(f)
    with open(profile_path) as f:
        cost = CostModel.from_dict(json.load(f))
    meta = runs[0]
    trace = rebuild_trace(meta, cost)
    out = []
    for row in runs:
        run = NodeCost(CostModel(scale_profile(cost.profile, row["at_run_speed"]["factors"])))
        entry = {"run": run_path, "policy": row["policy"],
                 "real": {k: row[k] for k in ("slo_attainment", "p95_s", "p99_s")}}
        latency = run_gap(row, job_gap) if job_gap else None
        if latency is not None:
            entry["job_latency_s"] = latency
        for label, res in (("lognormal", None), ("fitted", residuals)):
            sims = []
            for seed in seeds:
                result, _ = node_replay(trace, cost.profile, run, row["policy"],
                                        meta["devices"], seed, residuals=res,
                                        job_latency_s=latency)
                s = summarize(result.records)
                sims.append({k: s[k] for k in ("slo_attainment", "p95_s", "p99_s")})
            entry[label] = sims
        out.append(entry)
        log.info("%s %s done", run_path, row["policy"])
    return out


def gaps(run: dict) -> list[dict]:
    """Per kind of job of one policy's run row: the ``gaps`` figures of the module docstring
    (each job's span and stages: ``ditmem.tools.run_speed.job_spans``)."""
    from ditmem.tools.run_speed import job_spans

    groups: dict[str, list[tuple[float, float]]] = {}
    for kind, span, stages in job_spans(run):
        groups.setdefault(kind, []).append((span, stages))
    out = []
    for kind, pairs in sorted(groups.items()):
        gap = sorted(span - measured for span, measured in pairs)
        out.append({"policy": run["policy"], "jobs": kind, "n": len(pairs),
                    "span_s": sum(p[0] for p in pairs), "stages_s": sum(p[1] for p in pairs),
                    "gap_median_s": statistics.median(gap),
                    "gap_p95_s": gap[round(0.95 * (len(gap) - 1))], "gap_s": sum(gap)})
    return out


def print_gaps(rows: list[dict]) -> None:
    print(f"{'policy':<6} {'jobs':<28} {'n':>5} {'span s':>8} {'stages s':>9} "
          f"{'gap med ms':>11} {'p95 ms':>7} {'gap s':>6}")
    for r in rows:
        print(f"{r['policy']:<6} {r['jobs']:<28} {r['n']:>5} {r['span_s']:>8.2f} "
              f"{r['stages_s']:>9.2f} {1000 * r['gap_median_s']:>11.1f} "
              f"{1000 * r['gap_p95_s']:>7.1f} {r['gap_s']:>6.2f}")


def print_checks(entries: list[dict]) -> None:
    print(f"{'run':<28} {'policy':<6} {'real att/P95/P99':>22}   "
          f"{'3 % lognormal: att mean [min-max] / P95 / P99':<46} {'fitted: same'}")
    for e in entries:
        real = e["real"]
        cells = []
        for label in ("lognormal", "fitted"):
            sims = e[label]
            att = [100 * s["slo_attainment"] for s in sims]
            cells.append(f"{statistics.mean(att):5.1f} [{min(att):5.1f}-{max(att):5.1f}] / "
                         f"{statistics.mean(s['p95_s'] for s in sims):5.2f} / "
                         f"{statistics.mean(s['p99_s'] for s in sims):5.2f}")
        print(f"{Path(e['run']).name:<28} {e['policy']:<6} {100 * real['slo_attainment']:7.1f} "
              f"/ {real['p95_s']:5.2f} / {real['p99_s']:5.2f}   {cells[0]:<46} {cells[1]}")


def main(argv=None) -> int:
    from ditmem.scheduler.noise import fit_residuals

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="the measured noise of runs; the pools to --out")
    f.add_argument("runs", nargs="+", help="demo --devices --json files")
    f.add_argument("--out", help="write the pools and the figures here (JSON)")
    f.add_argument("--min-samples", type=int, default=20,
                   help="fewest single jobs for a class of its own (default 20)")
    c = sub.add_parser("check", help="the runs beside their replays, lognormal and fitted")
    c.add_argument("runs", nargs="+", metavar="RUN.json:PROFILE.json")
    c.add_argument("--fit", required=True, help="a file `fit --out` wrote")
    c.add_argument("--seeds", default="0-9", help="noise seeds (default 0-9)")
    c.add_argument("--json", help="write the rows here")
    c.add_argument("--job-gap", nargs="?", const="median", choices=("median", "mean"),
                   help="replay each run with its median (default) or mean gap per job "
                        "(gaps) as the truth's links.job_latency_s (runs with job timestamps)")
    g = sub.add_parser("gaps", help="per kind of job: the loop's span beside the stages")
    g.add_argument("run", help="a demo --devices --json file with job timestamps (ddcd44d on)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if args.cmd == "fit":
        rows = job_rows(args.runs)
        figures = stats(rows)
        print_stats(figures)
        if args.out:
            pools = fit_residuals(rows, min_samples=args.min_samples)
            with open(args.out, "w") as fh:
                json.dump({"source": args.runs, "stats": figures, "residuals": pools}, fh)
        return 0
    if args.cmd == "gaps":
        with open(args.run) as fh:
            runs = json.load(fh)
        if any(len(run["job_timings"]["columns"]) < 7 for run in runs):
            ap.error(f"{args.run}: its job_timings have no job timestamps (a run before ddcd44d)")
        print_gaps([row for run in runs for row in gaps(run)])
        return 0
    with open(args.fit) as fh:
        residuals = json.load(fh)["residuals"]
    entries = []
    for spec in args.runs:
        run_path, sep, profile_path = spec.partition(":")
        if not sep:
            ap.error(f"expected RUN.json:PROFILE.json, got {spec!r}")
        entries.extend(check_run(run_path, profile_path, residuals, parse_seeds(args.seeds),
                                 args.job_gap))
    print_checks(entries)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(entries, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
