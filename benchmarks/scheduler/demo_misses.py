"""Which requests a real ``ditmem demo`` run lost that its simulator replay keeps, and why.

Reads a demo JSON with ``per_request`` rows (``ditmem demo --json``, a4c7b46 on) and its
profile, rebuilds the run's trace, replays it in the simulator per policy on several noise
seeds (3 % lognormal, the demo's own prediction setting), and prints one row per request that
missed in the run or in any replay: shape, priority, arrival, window, the run's start, finish
and preemptions beside the first replay's, and how many replays missed it. Then, per policy,
the real and simulated start delays and slowdowns by shape class (median), so that a gap that
is the run's speed reads differently from one that is the policy's order. With
``--decisions`` (the run's ``ditmem demo --decisions`` file) each such request's timeline
follows, decision by decision, in the run and in the first replay: when it ran, waited or
waited as late, and what ran meanwhile (``scheduler.policies.recorder``).

    python benchmarks/scheduler/demo_misses.py RUN.json [--profile RUN_profile.json] \\
        [--noise-seeds 8] [--at-run-speed] [--decisions RUN_decisions.json] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_at_run_speed import DEMO_PAGE_BYTES, DEMO_POOL_PAGES  # noqa: E402
from replay_bench import demo_trace  # noqa: E402

from ditmem.scheduler import CostModel  # noqa: E402
from ditmem.scheduler.noise import DEFAULT_SIGMA, TimingNoise  # noqa: E402
from ditmem.scheduler.policies import make_policy  # noqa: E402
from ditmem.scheduler.policies.recorder import Decision, DecisionLog, describe, timeline  # noqa: E402
from ditmem.scheduler.simulator import simulate  # noqa: E402
from ditmem.tools.report import request_rows  # noqa: E402
from ditmem.tools.run_speed import scale_profile, speed_factors  # noqa: E402


def replay_decode(run: dict) -> str:
    """The decode mode the demo's own prediction replays ``run`` with (``ditmem demo``'s
    ``predict``): ``"concurrent"`` when the run decoded on worker threads, else the run's."""
    if run.get("decode_workers"):
        return "concurrent"
    return run["decode"].get(run["policy"], "inline")


def replays(run: dict, cost: CostModel, seeds: int, sigma: float, at_run_speed: bool = False
            ) -> tuple[list[dict[str, dict]], list[Decision]]:
    """Per noise seed, the simulator's per-request rows for ``run``'s trace, keyed by id;
    and the first replay's decisions. ``at_run_speed``: the device's truth is the profile
    scaled per kind by what the run measured (``run_speed.speed_factors``), the policy
    plans with the profile, as the demo's own "at run speed" prediction."""
    reqs = demo_trace(run, cost)
    truth = CostModel(scale_profile(cost.profile, speed_factors(run["vs_profile"]))) \
        if at_run_speed else None
    out, first = [], None
    for seed in range(seeds):
        policy = DecisionLog(make_policy(run["policy"], cost.fresh()))
        result = simulate([dataclasses.replace(r) for r in reqs], policy, truth,
                          page_bytes=DEMO_PAGE_BYTES, device_pages=DEMO_POOL_PAGES,
                          decode=replay_decode(run),
                          noise=TimingNoise(sigma=sigma, seed=seed))
        out.append({row["id"]: row for row in request_rows(result.records)})
        first = policy.log if first is None else first
    return out, first


def print_timelines(res: dict, real_log: list[Decision], sim_log: list[Decision],
                    real: dict[str, dict], sim: dict[str, dict]) -> None:
    """Each listed request's timeline in the run and in the first replay."""
    for r in res["lost"]:
        rid = r["id"]
        for name, log, row in (("run", real_log, real[rid]), ("replay", sim_log, sim[rid])):
            print(f"-- {rid} ({r['shape']}, due {row['deadline_s']:.2f}) in the {name}: "
                  f"arrived {row['arrival_s']:.2f}, finished {row['finished_s']:.2f}")
            print(describe(timeline(log, rid, row["arrival_s"], row["finished_s"])))
            for d in log:  # logs written since session 20 say why slo set it aside
                for gid, rem, left, alone in d.gave_up:
                    if gid == rid:
                        print(f"   set aside at {d.now:.2f}: predicted {rem:.2f} s left to "
                              f"run, {left:.2f} s to its deadline "
                              f"({'too late even alone' if alone else 'a prefix overran'})")


def compare(run: dict, sims: list[dict[int, dict]]) -> dict:
    """The rows and per-shape medians for one policy's run (times in s on the run's clock)."""
    real = {row["id"]: row for row in run["per_request"]}
    missing = set(real) ^ set(sims[0])
    if missing:
        raise ValueError(f"the replay's trace differs from the run's: ids {sorted(missing)[:5]}")
    lost = []
    for rid, r in real.items():
        sim_miss = sum(not s[rid]["met"] for s in sims)
        if r["met"] and not sim_miss:
            continue
        s = sims[0][rid]
        lost.append({"id": rid, "shape": r["shape"], "priority": r["priority"],
                     "arrival_s": r["arrival_s"], "window_s": r["deadline_s"] - r["arrival_s"],
                     "real_wait_s": r["started_s"] - r["arrival_s"],
                     "real_latency_s": r["latency_s"], "real_preemptions": r["preemptions"],
                     "real_met": r["met"], "sim_wait_s": s["started_s"] - s["arrival_s"],
                     "sim_latency_s": s["latency_s"], "sim_preemptions": s["preemptions"],
                     "sim_missed_of": f"{sim_miss}/{len(sims)}"})
    shapes = {}
    for shape in sorted({r["shape"] for r in real.values()}):
        ids = [i for i, r in real.items() if r["shape"] == shape]
        window = {i: real[i]["deadline_s"] - real[i]["arrival_s"] for i in ids}
        shapes[shape] = {
            "n": len(ids),
            "real_wait_s": statistics.median(real[i]["started_s"] - real[i]["arrival_s"]
                                             for i in ids),
            "sim_wait_s": statistics.median(sims[0][i]["started_s"] - sims[0][i]["arrival_s"]
                                            for i in ids),
            "real_latency_per_window": statistics.median(real[i]["latency_s"] / window[i]
                                                         for i in ids),
            "sim_latency_per_window": statistics.median(sims[0][i]["latency_s"] / window[i]
                                                        for i in ids),
            "real_misses": sum(not real[i]["met"] for i in ids),
            "sim_misses_mean": statistics.mean(sum(not s[i]["met"] for i in ids)
                                               for s in sims),
        }
    return {"policy": run["policy"], "lost": lost, "shapes": shapes,
            "real_misses": sum(not r["met"] for r in real.values()),
            "sim_misses": [sum(not r["met"] for r in s.values()) for s in sims]}


def print_report(path: str, res: dict) -> None:
    print(f"\n{path} [{res['policy']}]: the run missed {res['real_misses']}; the replays "
          f"missed {res['sim_misses']}")
    head = (f"{'id':>4} {'shape':>9} {'p':>2} {'arrive':>8} {'window':>7} | {'wait':>6} "
            f"{'latency':>8} {'pre':>3} {'met':>4} | {'wait':>6} {'latency':>8} {'pre':>3} "
            f"{'missed':>6}")
    print(f"{'':41}| {'the run':^25}| {'replay (noise seed 0)':^28}")
    print(head)
    for r in res["lost"]:
        print(f"{r['id']:>4} {r['shape']:>9} {r['priority']:>2} {r['arrival_s']:>8.2f} "
              f"{r['window_s']:>7.2f} | {r['real_wait_s']:>6.2f} {r['real_latency_s']:>8.2f} "
              f"{r['real_preemptions']:>3} {'yes' if r['real_met'] else 'no':>4} | "
              f"{r['sim_wait_s']:>6.2f} {r['sim_latency_s']:>8.2f} {r['sim_preemptions']:>3} "
              f"{r['sim_missed_of']:>6}")
    print(f"{'shape':>9} {'n':>4} {'wait real':>10} {'wait sim':>9} {'lat/window real':>16} "
          f"{'sim':>6} {'misses real':>12} {'sim':>5}")
    for shape, s in res["shapes"].items():
        print(f"{shape:>9} {s['n']:>4} {s['real_wait_s']:>10.3f} {s['sim_wait_s']:>9.3f} "
              f"{s['real_latency_per_window']:>16.3f} {s['sim_latency_per_window']:>6.3f} "
              f"{s['real_misses']:>12} {s['sim_misses_mean']:>5.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="demo JSON files with per_request rows")
    ap.add_argument("--profile", default=None,
                    help="the run's profile (default: RUN_profile.json beside each run)")
    ap.add_argument("--noise-seeds", type=int, default=8)
    ap.add_argument("--sigma", type=float, default=DEFAULT_SIGMA)
    ap.add_argument("--at-run-speed", action="store_true",
                    help="replay with the device's times scaled per kind by the run's own "
                         "(the run's vs_profile), the policy planning with the profile")
    ap.add_argument("--decisions", default=None,
                    help="the run's decisions (ditmem demo --decisions; one run only): print "
                         "each listed request's timeline in the run and in the replay")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.decisions and len(args.runs) > 1:
        ap.error(f"--decisions: one run's decisions, got {len(args.runs)} runs")
    out = []
    for path in args.runs:
        profile = args.profile or path.removesuffix(".json") + "_profile.json"
        cost = CostModel.load(profile)
        with open(path) as fh:
            rows = json.load(fh)
        for run in rows:
            if "per_request" not in run:
                sys.exit(f"{path}: the {run['policy']} row has no per_request rows (a run "
                         "before a4c7b46)")
            sims, sim_log = replays(run, cost, args.noise_seeds, args.sigma, args.at_run_speed)
            res = compare(run, sims)
            print_report(path, res)
            if args.decisions:
                with open(args.decisions) as fh:
                    real_log = [Decision.from_row(d) for d in json.load(fh)[run["policy"]]]
                print_timelines(res, real_log, sim_log,
                                {row["id"]: row for row in run["per_request"]}, sims[0])
            out.append(dict(res, run=path))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
        print(f"json: {args.json}")


if __name__ == "__main__":
    main()
