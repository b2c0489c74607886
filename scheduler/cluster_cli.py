"""``ditmem sim --replicas R --router ditmem|round-robin|pow2``: replicas behind a router.

    ditmem sim --workload seed-mix --replicas 4 --devices 8 --router ditmem,round-robin,pow2 \\
               --policy slo --load 0.8 --arrival gamma:2 --device h200 --seeds 3

Each replica is a node of ``--devices`` devices (the node simulator, one ``--policy``;
default 1 device: a node of one) with its own timing noise; the router places every
request at its arrival from the replicas' reports (every ``--report-s`` seconds) and what it
routed since (:mod:`ditmem.scheduler.cluster`). ``--load ρ`` is per device: arrival rate ×
mean standalone time at degree 1 ÷ (R × D). One row per router, seeds pooled.
"""

from __future__ import annotations

from .cli import SIM_ERRORS, fail, write_rows
from .cluster import ReplicaRun, simulate_cluster
from .cluster_replica import Resimulated, SteppedNode
from .cost import CostModel
from .metrics import summarize
from .noise import TimingNoise
from .routing import ROUTERS, make_router
from .workloads import workload

HEADER = (f"{'router':<12} {'workload':<12} {'arrival':<9} {'load':>5} {'R':>2} {'D':>2} "
          f"{'requests':>8} {'att%':>7} {'p0%':>7} {'P50 s':>8} {'P95 s':>8} {'P99 s':>8}")


class StepLog:
    """A node policy that also logs each request's steps done at the end of every job
    (``progress`` of :class:`~.cluster.ReplicaRun`); everything else is ``policy``'s."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.progress: dict[str, list[tuple[float, int]]] = {}

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def schedule(self, view):
        return self.policy.schedule(view)

    def observe(self, report) -> None:
        for rid in report.batch:
            marks = self.progress.setdefault(rid, [])
            marks.append((report.now, (marks[-1][1] if marks else 0) + report.steps))
        self.policy.observe(report)


def run_cluster_point(cost: CostModel, name: str, router: str, *, replicas: int, devices: int,
                      policy: str, load: float, seeds, arrival: str, slo_scale: float,
                      noise: float, bias: float, report_s: float, requests: int | None,
                      scale: str = "gpu", stepped: bool = True) -> dict:
    """One router at one load, seeds pooled: ``summarize``'s fields plus the setting.
    ``stepped``: each node replica runs once, fed live (:class:`.cluster_replica.SteppedNode`);
    False: re-simulated from t = 0 at every report (the same figures, the square of the
    time; the reference the stepped run is tested against)."""
    from .node.cost import NodeCost
    from .node.device import VirtualDevices
    from .node.policies import make_node_policy
    from .node.simulator import run_node, simulate_node
    from .node.topology import Node

    records, refreshes = [], 0
    for seed in seeds:
        reqs = workload(name, cost, load=load * replicas * devices, requests=requests,
                        seed=seed, arrival=arrival, slo_scale=slo_scale, scale=scale)

        def node_policy(index, seed=seed):
            ncost = NodeCost(cost)
            node = Node(devices, ncost.links)
            pol = StepLog(make_node_policy(policy, ncost, node))
            return pol, node, TimingNoise(noise, bias, 1000 * seed + index)

        def run_replica(assigned, index):
            pol, node, jitter = node_policy(index)
            out = simulate_node(assigned, pol, node, noise=jitter, slo_scale=slo_scale)
            return ReplicaRun(out.records, pol.progress)

        def stepped_replica(index, model=reqs[0].model):
            pol, node, jitter = node_policy(index)
            truth = NodeCost(pol.ncost.cost, pol.ncost.parallel)  # as simulate_node builds it

            def run(intake, held, on_record):
                return run_node(intake, pol, held, node, truth, slo_scale=slo_scale,
                                on_record=on_record)

            return SteppedNode(run, model, VirtualDevices(truth, jitter, node.devices),
                               pol.progress)

        make = stepped_replica if stepped else (lambda i: Resimulated(run_replica, i))
        result = simulate_cluster(reqs, replicas, make_router(router, seed), make,
                                  devices=devices, report_s=report_s)
        records += result.records
        refreshes += result.refreshes
    out = {"router": router, "workload": name, "arrival": arrival, "load": load,
           "replicas": replicas, "devices": devices, "policy": policy,
           "device": cost.name, "seeds": list(seeds), "noise": noise, "bias": bias,
           "report_s": report_s, "refreshes": refreshes}
    out.update(summarize(records))
    return out


def line(row: dict) -> str:
    p0 = row["per_priority"]["0"]["slo_attainment"]
    return (f"{row['router']:<12} {row['workload']:<12} {row['arrival']:<9} "
            f"{row['load']:5.2f} {row['replicas']:2d} {row['devices']:2d} "
            f"{row['requests']:8d} {100 * row['slo_attainment']:7.2f} "
            f"{'-' if p0 is None else f'{100 * p0:.2f}':>7} {row['p50_s']:8.2f} "
            f"{row['p95_s']:8.2f} {row['p99_s']:8.2f}")


def cluster_main(args) -> int:
    """The ``sim`` command with ``--replicas``; returns the exit code."""
    try:
        if args.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {args.replicas}")
        if args.workload is None:
            raise ValueError("--replicas needs --workload")
        routers = [r.strip() for r in args.router.split(",") if r.strip()]
        unknown = [r for r in routers if r not in ROUTERS]
        if unknown or not routers:
            raise ValueError(f"--router: unknown {unknown}; choose from {', '.join(ROUTERS)}")
        policies = [p.strip() for p in args.policy.split(",") if p.strip()]
        if len(policies) != 1:
            raise ValueError("--replicas: give one --policy (every replica runs it)")
        cost = CostModel.load(args.device)
        seeds = tuple(range(args.seed, args.seed + max(1, args.seeds)))
        devices = args.devices or 1
        rows = []
        print(HEADER)
        for router in routers:
            row = run_cluster_point(
                cost, args.workload, router, replicas=args.replicas, devices=devices,
                policy=policies[0], load=args.load, seeds=seeds, arrival=args.arrival,
                slo_scale=args.slo_scale, noise=args.noise, bias=args.bias,
                report_s=args.report_s, requests=args.requests, scale=args.scale)
            rows.append(row)
            print(line(row), flush=True)
        return write_rows(rows, args.json)
    except SIM_ERRORS as exc:
        return fail(exc)
