"""Why node ``slo`` misses on a workload near its goodput (8 × h200, noise on).

    python benchmarks/scheduler/node_omni_why.py --load 1.02 --seeds 0,1 [--requests 2000]
        [--workload omni-mix] [--options '{"min_gain": 0.1}'] [--list]

Per missed request: its tier, wait before its first step, latency, how far into its SLO
window ``slo`` first set it aside as late (the give-up rule, step 2, or no degree meeting
it), the degrees it ran at, and where its time went until its deadline
(``recorder.time_split``: waiting with the node's devices held by large steps/decodes or
small requests). Prints the pooled summary; ``--list`` also prints every missed request.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from ditmem.scheduler import CostModel
from ditmem.scheduler.node.cost import NodeCost
from ditmem.scheduler.node.policies.recorder import DecisionLog, time_split
from ditmem.scheduler.node.policies.slo import NodeSloPolicy
from ditmem.scheduler.node.simulator import simulate_node
from ditmem.scheduler.node.topology import Node
from ditmem.scheduler.noise import TimingNoise
from ditmem.scheduler.workloads import workload


class _Watched(NodeSloPolicy):
    """``slo`` unchanged, noting when each request is first judged late (s after arrival)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.late_at: dict[str, float] = {}


    def _classify(self, now, ontime):
        out = super()._classify(now, ontime)
        for c in ontime:
            if c.late:
                self.late_at.setdefault(c.req.id, now - c.req.arrival)
        return out

    def _cand(self, item, req, steps_done, home, now):
        c = super()._cand(item, req, steps_done, home, now)
        if c.late:
            self.late_at.setdefault(req.id, now - req.arrival)
        return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="omni-mix")
    ap.add_argument("--load", type=float, default=1.02)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--options", default="{}", help="slo options as JSON")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    cost = CostModel.load("h200")
    tiers, missed, split = Counter(), Counter(), Counter()
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        reqs = workload(args.workload, cost, load=args.load * 8, requests=args.requests,
                        seed=seed, arrival="poisson", slo_scale=3.0, scale="gpu")
        big = max(r.width * r.height for r in reqs)
        ncost = NodeCost(cost)
        node = Node(8, ncost.links)
        pol = _Watched(ncost, node, **json.loads(args.options))
        log = DecisionLog(pol, lambda q, big=big: q.width * q.height >= big)
        recs = simulate_node(reqs, log, node, noise=TimingNoise(0.03, 0.0, seed)).records
        where = time_split(log.log, recs, lambda r: not r.met, lambda r: r.request.deadline)
        judged = sum(r.request.id in pol.late_at for r in recs)
        kept = sum(r.met and r.request.id in pol.late_at for r in recs)
        print(f"seed {seed}: attainment {sum(r.met for r in recs) / len(recs):.4f}; judged late "
              f"at some decision {judged} (met anyway {kept})")
        for r in recs:
            q = r.request
            tiers[q.width] += 1
            if r.met:
                continue
            missed[q.width] += 1
            split.update(where[q.id])
            rows.append({"seed": seed, "id": q.id, "side": q.width,
                         "arrival_s": round(q.arrival, 1),
                         "window_s": round(q.deadline - q.arrival, 1),
                         "first_step_after_s": round(r.started - q.arrival, 1),
                         "latency_s": round(r.latency, 1),
                         "late_after_s": round(pol.late_at.get(q.id, float("nan")), 1),
                         "degrees": dict(sorted(r.degrees.items()))})
    n = max(1, sum(missed.values()))
    print("requests by side", dict(sorted(tiers.items())), "missed", dict(sorted(missed.items())))
    print("per missed request, to its deadline (s):",
          ", ".join(f"{k} {v / n:.1f}" for k, v in split.most_common()))
    if rows:
        late = sorted(r["late_after_s"] / r["window_s"] for r in rows)
        first = sorted(r["first_step_after_s"] for r in rows)
        d1 = sum(r["degrees"].get(1, 0) for r in rows) / max(1, sum(
            sum(r["degrees"].values()) for r in rows))
        print(f"judged late after a median {late[len(late) // 2]:.2f} of its window; first step "
              f"a median {first[len(first) // 2]:.1f} s after arrival; {d1:.1%} of its steps "
              f"at degree 1")
    if args.list:
        for r in rows:
            print(json.dumps(r))


if __name__ == "__main__":
    main()
