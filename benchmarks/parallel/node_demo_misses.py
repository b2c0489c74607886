"""Which requests a real two-device ``ditmem demo`` lost that its simulator replay kept, and
what each did decision by decision in both (issue 16).

Reads the demo's JSON (``ditmem demo --devices 2 --json RUN.json``: ``per_request`` and
``sim_per_request`` rows, ``missed_apart``) and its decision log (``--decisions D.json``:
per policy, the run's and the replay's ``DecisionLog.rows()``), and prints per policy:

* how many decisions each made, and its take-backs: asked, with a spare offered, spares
  granted (counts);
* one row per request missed apart (or each ``--ids``): shape, priority, arrival, deadline,
  start / finish / preemptions in the run beside the replay's;
* with ``--rides``, per missed request of the run: in how many of the decisions that had it
  in a job it shared that job's step with a larger request (rode a longer step: a late
  request joining a 1024²'s degree-1 steps takes 28 of them);
* with ``--at-run-speed PROFILE`` (the run's ``--profile-out`` JSON), the replay compared
  against is not the demo's (the start-up profile's speed) but a fresh one at the speed the
  run measured (``ditmem.tools.run_speed``: the trace rebuilt from the run's settings, the
  truth scaled per kind by the run's ``at_run_speed`` factors, the policy planning with the
  profile, noise σ 3 % seeded with the run's seed), logged the same way;
* with ``--timelines``, each such request's timeline in the run and in the replay
  (``scheduler.node.policies.recorder.timeline``): when it ran, at which degree, when it
  waited (late or not) and who held the devices meanwhile.

    python benchmarks/parallel/node_demo_misses.py RUN.json D.json [--policy slo]
        [--ids r00051,r00058] [--timelines] [--rides] [--at-run-speed RUN_profile.json]
        [--json OUT.json]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys

from ditmem.scheduler.node.policies.recorder import describe, from_rows, timeline


def take_back_summary(rows: dict) -> dict:
    """Counts over one log's ``take_backs``: asked, with a spare offered, granted."""
    tb = rows["take_backs"]
    return {"asked": len(tb), "offered": sum(bool(t["offered"]) for t in tb),
            "granted": sum(len(t["granted"]) for t in tb)}


def rides(decisions: list[dict], rows: list[dict]) -> dict[str, tuple[int, int]]:
    """Per request id: (decisions that had it in a job, of those the ones whose job also
    held a request of more pixels), from a log's ``decisions`` rows and ``per_request``."""
    pixels = {}
    for q in rows:
        w, h = (int(x) for x in q["shape"].split("x")[:2])
        pixels[q["id"]] = w * h
    seen: collections.Counter = collections.Counter()
    rode: collections.Counter = collections.Counter()
    for d in decisions:
        jobs = collections.defaultdict(list)
        for rid, devices, _last, _large in d["jobs"]:
            jobs[tuple(devices)].append(rid)
        for ids in jobs.values():
            top = max(pixels[i] for i in ids)
            for i in ids:
                seen[i] += 1
                rode[i] += pixels[i] < top
    return {i: (seen[i], rode[i]) for i in seen}


def replay_at_run_speed(meta: dict, row: dict, profile_path: str) -> tuple[list, dict]:
    """``row``'s policy on its run's trace at the run's measured speed: (``per_request``
    rows, ``DecisionLog.rows()``). ``meta``: the run JSON's first row (workload, load,
    requests, seed, divisor, devices)."""
    from ditmem.scheduler import CostModel
    from ditmem.scheduler.node.cost import NodeCost
    from ditmem.tools.node_demo import logged, rebuild_trace
    from ditmem.tools.report import request_rows
    from ditmem.tools.run_speed import node_replay, scale_profile

    with open(profile_path) as f:
        cost = CostModel.from_dict(json.load(f))
    trace = rebuild_trace(meta, cost)
    run = NodeCost(CostModel(scale_profile(cost.profile, row["at_run_speed"]["factors"])))
    result, log = node_replay(trace, cost.profile, run, row["policy"], meta["devices"],
                              meta["seed"], wrap=lambda p: logged(p, trace, True))
    return request_rows(result.records), log.rows()


def request_row(q: dict, s: dict) -> str:
    return (f"{q['id']} {q['shape']:>9} p{q['priority']} arr {q['arrival_s']:7.2f} "
            f"dl {q['deadline_s']:7.2f} | run start {q['started_s']:7.2f} fin "
            f"{q['finished_s']:7.2f} pre {q['preemptions']} {'met' if q['met'] else 'MISS'} | "
            f"sim start {s['started_s']:7.2f} fin {s['finished_s']:7.2f} pre "
            f"{s['preemptions']} {'met' if s['met'] else 'MISS'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="ditmem demo --devices 2 --json file")
    ap.add_argument("decisions", help="its --decisions file (.gz: gzip-compressed)")
    ap.add_argument("--policy", default="slo", help="fifo or slo (default slo)")
    ap.add_argument("--ids", default=None, help="comma-separated ids (default: missed apart)")
    ap.add_argument("--timelines", action="store_true", help="print each one's timeline")
    ap.add_argument("--rides", action="store_true",
                    help="per missed request of the run: decisions riding a larger step")
    ap.add_argument("--at-run-speed", metavar="PROFILE", default=None,
                    help="compare with a replay at the run's measured speed (the run's "
                         "--profile-out JSON)")
    ap.add_argument("--json", default=None, help="write the rows and timelines here")
    args = ap.parse_args(argv)
    with open(args.run) as f:
        runs_json = json.load(f)
    rows = {r["policy"]: r for r in runs_json}
    opener = gzip.open if args.decisions.endswith(".gz") else open
    with opener(args.decisions, "rt") as f:
        logs = json.load(f)
    if args.policy not in rows or args.policy not in logs:
        print(f"node_demo_misses: --policy {args.policy!r}: not in both files "
              f"({sorted(rows)} / {sorted(logs)})", file=sys.stderr)
        return 2
    row, log = rows[args.policy], dict(logs[args.policy])
    real = {q["id"]: q for q in row["per_request"]}
    sim = {q["id"]: q for q in row["sim_per_request"]}
    if args.at_run_speed:
        per, log["sim"] = replay_at_run_speed(runs_json[0], row, args.at_run_speed)
        sim = {q["id"]: q for q in per}
        apart = [i for i, q in real.items() if q["met"] != sim[i]["met"]]
        row = dict(row, missed_apart={
            "run_only": [i for i in apart if not real[i]["met"]],
            "sim_only": [i for i in apart if real[i]["met"]]})
        print(f"replay at the run's speed: {100 * sum(q['met'] for q in per) / len(per):.1f} % "
              f"(the run: {100 * sum(q['met'] for q in real.values()) / len(real):.1f} %)")
    if args.ids:
        ids = [i.strip() for i in args.ids.split(",") if i.strip()]
        unknown = [i for i in ids if i not in real]
        if unknown:
            print(f"node_demo_misses: --ids: unknown {unknown}", file=sys.stderr)
            return 2
    else:
        ids = row["missed_apart"]["run_only"] + row["missed_apart"]["sim_only"]
    out = {"policy": args.policy, "take_backs": {}, "requests": []}
    print(f"policy {args.policy}: decisions run {len(log['run']['decisions'])}, "
          f"sim {len(log['sim']['decisions'])}")
    for side in ("run", "sim"):
        s = take_back_summary(log[side])
        out["take_backs"][side] = s
        print(f"  take-backs {side}: asked {s['asked']}, with a spare {s['offered']}, "
              f"granted {s['granted']}")
    if args.rides:
        counts = rides(log["run"]["decisions"], row["per_request"])
        missed = [q for q in row["per_request"] if not q["met"]]
        out["rides"] = {q["id"]: counts.get(q["id"], (0, 0)) for q in missed}
        print(f"missed in the run: {len(missed)}, of which rode a larger step: "
              f"{sum(1 for q in missed if counts.get(q['id'], (0, 0))[1] > 0)}")
        for q in missed:
            n, k = counts.get(q["id"], (0, 0))
            print(f"  {q['id']} {q['shape']:>9} latency {q['latency_s']:6.2f} s: in a job at "
                  f"{n} decisions, riding a larger request's step at {k}")
    runs = {side: from_rows(log[side]["decisions"]) for side in ("run", "sim")}
    for rid in ids:
        q, s = real[rid], sim[rid]
        print(request_row(q, s))
        item = {"id": rid, "run": q, "sim": s}
        if args.timelines:
            for side, rec in (("run", q), ("sim", s)):
                segs = timeline(runs[side], rid, rec["arrival_s"], rec["finished_s"])
                print(f"  {side}:\n" + "\n".join("    " + line
                                                 for line in describe(segs).splitlines()))
                item[f"{side}_timeline"] = [
                    {"state": g.state, "start": g.start, "end": g.end,
                     "decisions": g.decisions, "held": dict(g.others.most_common(5))}
                    for g in segs]
        out["requests"].append(item)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
