"""Decision time of the node policies: 8 devices, 512 started (64 per device), 10,000 waiting.

    python benchmarks/scheduler/node_overhead.py [--json OUT] [--repeats 5] [--decisions 200]

The view is a snapshot of a loaded node (seed-mix requests on h200): 504 started requests
paused and resident on their groups, 8 running (one per device, so one device is free per
decision in turn), 10,000 waiting. Each decision is timed in CPU time of the process
(``time.process_time``: the decision's own cost, unaffected by other jobs sharing the cores;
``--wall`` uses ``perf_counter`` instead) (median of
``repeats`` runs of ``decisions`` decisions, one arrival pushed between decisions); the
baseline in the same run is ``fifo`` on static replicas (pops the queue head only);
``slo-promise`` is ``slo`` with its FIFO promise on.
Target (issue 15): one ``slo`` decision < 5 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from ditmem.scheduler import CostModel, WaitingQueue
from ditmem.scheduler.node.cost import NodeCost
from ditmem.scheduler.node.plan import NodeStatus, NodeView
from ditmem.scheduler.node.policies import NODE_POLICIES, make_node_policy
from ditmem.scheduler.node.topology import Node
from ditmem.scheduler.workloads import workload

DEVICES, STARTED, WAITING = 8, 512, 10_000


def snapshot(cost: CostModel, node: Node, ncost: NodeCost):
    reqs = workload("seed-mix", cost, load=0.8 * DEVICES, requests=STARTED + WAITING + 2000)
    started = []
    for i, r in enumerate(reqs[:STARTED]):
        group = node.groups(1)[i % DEVICES]
        s = NodeStatus(r, steps_done=1 + i % (r.steps - 1), group=group, pages=1)
        s.running = i < DEVICES
        s.job_end = 1.0
        started.append(s)
    waiting = WaitingQueue()
    for r in reqs[STARTED : STARTED + WAITING]:
        waiting.push(r)
    return started, waiting, reqs[STARTED + WAITING :]


#: Rows besides the registry's policies: (label, policy, options).
VARIANTS = [("slo-promise", "slo", {"guard": True})]


def time_policy(name: str, decisions: int, clock=time.process_time, **options) -> float:
    cost = CostModel.load("h200")
    ncost = NodeCost(cost)
    node = Node(DEVICES, ncost.links)
    pol = make_node_policy(name, ncost, node, **options)
    started, waiting, extra = snapshot(cost, node, ncost)
    now = max(r.arrival for r in waiting.iter_by("arrival"))
    paused = [s for s in started if not s.running]
    running = [s for s in started if s.running]
    elapsed = []
    for k in range(decisions):
        free_dev = k % DEVICES
        view = NodeView(now, node, 1 << free_dev, paused, running, waiting,
                        [1000] * DEVICES, 10_000, cost.page_bytes, None)
        t0 = clock()
        pol.schedule(view)
        elapsed.append(clock() - t0)
        r = extra[k % len(extra)]
        if r.id not in waiting:
            waiting.push(r)
    return statistics.median(elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results as JSON")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--decisions", type=int, default=200)
    parser.add_argument("--wall", action="store_true", help="wall time (perf_counter)")
    args = parser.parse_args()
    clock = time.perf_counter if args.wall else time.process_time
    rows = []
    print(f"{'policy':<11} {'ms / decision':>14} {'vs fifo':>8}")
    base = None
    for label, name, options in [(n, n, {}) for n in NODE_POLICIES] + VARIANTS:
        ms = 1e3 * statistics.median(
            time_policy(name, args.decisions, clock, **options) for _ in range(args.repeats)
        )
        base = ms if name == "fifo" else base
        rows.append({"policy": label, "ms_per_decision": ms, "devices": DEVICES,
                     "started": STARTED, "waiting": WAITING,
                     "clock": "wall" if args.wall else "process CPU"})
        print(f"{label:<11} {ms:14.3f} {ms / base:7.1f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
