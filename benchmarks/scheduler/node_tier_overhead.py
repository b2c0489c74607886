"""Decision time of node ``slo`` with ``tier_goal`` on and its goal active, beside the default.

    python benchmarks/scheduler/node_tier_overhead.py [--repeats 3] [--decisions 200]

The view is node_overhead.py's loaded node (8 devices, 504 paused + 8 running started
requests, 10,000 waiting; seed-mix on h200). For ``tier_goal`` the policy's TierGoals is
seeded with every waiting arrival and 100 finished 2048² latencies (20.0-29.9 s), so the
goal of the P95's tier is active from the first decision (node_overhead.py's fresh policy
has none). Process CPU time per decision, median of ``repeats`` × ``decisions``.
Target (issue 15): < 5 ms.
"""

from __future__ import annotations

import argparse
import statistics
import time

from node_overhead import DEVICES, snapshot

from ditmem.scheduler import CostModel
from ditmem.scheduler.node.cost import NodeCost
from ditmem.scheduler.node.plan import NodeView
from ditmem.scheduler.node.policies import make_node_policy
from ditmem.scheduler.node.topology import Node


def time_slo(options: dict, decisions: int) -> float:
    """Median seconds of one decision of ``slo`` with ``options``."""
    cost = CostModel.load("h200")
    ncost = NodeCost(cost)
    node = Node(DEVICES, ncost.links)
    pol = make_node_policy("slo", ncost, node, **options)
    started, waiting, extra = snapshot(cost, node, ncost)
    now = max(r.arrival for r in waiting.iter_by("arrival"))
    tg = pol.tier_goals
    if tg is not None:
        for r in waiting.iter_by("arrival"):
            tg.see(r, ncost.standalone(r, 1))
        big = [r for r in waiting.iter_by("arrival") if r.width == 2048][:100]
        for i, r in enumerate(big):
            tg.finished(r.id, r.arrival + 20.0 + 0.1 * i)
        if not tg.goals():
            raise RuntimeError("the tier goal is not active")
    paused = [s for s in started if not s.running]
    running = [s for s in started if s.running]
    elapsed = []
    for k in range(decisions):
        view = NodeView(now, node, 1 << (k % DEVICES), paused, running, waiting,
                        [1000] * DEVICES, 10_000, cost.page_bytes, None)
        t0 = time.process_time()
        pol.schedule(view)
        elapsed.append(time.process_time() - t0)
        r = extra[k % len(extra)]
        if r.id not in waiting:
            waiting.push(r)
    return statistics.median(elapsed)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decisions", type=int, default=200)
    a = ap.parse_args(argv)
    for label, opts in (("slo", {}), ("slo tier_goal", {"tier_goal": True})):
        ms = 1e3 * statistics.median(time_slo(opts, a.decisions) for _ in range(a.repeats))
        print(f"{label:14s} {ms:7.3f} ms / decision (process CPU)", flush=True)


if __name__ == "__main__":
    main()
