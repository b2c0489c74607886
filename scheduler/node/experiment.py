"""Experiments on a node: one operating point, goodput by bisection, the bound beside them.

Load on D devices: ρ = arrival rate × mean standalone time at degree 1 ÷ D, so ρ means the
same across D and across policies (the workload is built at ``load = ρ · D``). Every seed
is simulated with its own timing noise (seeded by the seed) and the records are pooled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..cost import CostModel
from ..experiment import highest_load
from ..metrics import summarize
from ..noise import TimingNoise
from ..request import Request
from ..workloads import workload
from .bound import clairvoyant_node_misses, latency_bound, latency_floor, min_node_misses
from .cost import NodeCost
from .policies import STATIC, make_node_policy
from .simulator import simulate_node
from .topology import Node


@dataclass(slots=True)
class NodeScenario:
    """What to simulate on the node, besides the policy and the load."""

    cost: CostModel
    devices: int
    workload: str
    requests: int | None = None
    seeds: tuple[int, ...] = (0,)
    arrival: str = "poisson"
    slo_scale: float = 3.0
    scale: str = "gpu"
    noise: float = 0.03
    bias: float = 0.0
    policy_options: dict[str, dict] = field(default_factory=dict)
    per_request: bool = False
    bias_by: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.node()  # validates devices
        NodeCost(self.cost)  # validates the profile's parallel and links sections

    def node(self) -> Node:
        return Node(self.devices, None)

    def requests_for(self, load: float, seed: int) -> list[Request]:
        return workload(
            self.workload,
            self.cost,
            load=load * self.devices,
            requests=self.requests,
            seed=seed,
            arrival=self.arrival,
            slo_scale=self.slo_scale,
            scale=self.scale,
        )


def run_node_point(
    scenario: NodeScenario,
    policy: str,
    load: float,
    baseline_degree: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Simulate every seed at ``load`` under ``policy``; pooled metrics plus descriptors:
    ``devices``, ``baseline_degree`` (static policies; None otherwise), ``steps_by_degree``,
    for a policy that makes FIFO promises (``slo``'s guard) ``promises_kept`` (fraction of
    requests finished by their promise) and ``promise_late_max_s`` (the most any finished
    after it; <= 0 when all were kept), and, with ``scenario.per_request``, ``per_request``
    = [{id, seed, width, height, frames, priority, latency_s, met, degrees}]."""
    records, per_request = [], []
    decisions = kept = promised = 0
    late_by = 0.0
    for seed in scenario.seeds:
        reqs = scenario.requests_for(load, seed)
        ncost = NodeCost(scenario.cost)
        node = Node(scenario.devices, ncost.links)
        options = dict(scenario.policy_options.get(policy, {}))
        if policy in STATIC:
            options["baseline_degree"] = baseline_degree
        pol = make_node_policy(policy, ncost, node, **options)
        noise = TimingNoise(scenario.noise, scenario.bias, seed, scenario.bias_by)
        result = simulate_node(
            reqs, pol, node, noise=noise, slo_scale=scenario.slo_scale, progress=progress
        )
        records += result.records
        decisions += result.decisions
        promises = getattr(pol, "promises", None)
        if promises:
            for r in result.records:
                due = promises.get(r.request.id)
                if due is not None:
                    promised += 1
                    kept += r.finished <= due + 1e-9
                    late_by = max(late_by, r.finished - due)
        if scenario.per_request:
            per_request += [
                {
                    "id": r.request.id,
                    "seed": seed,
                    "width": r.request.width,
                    "height": r.request.height,
                    "frames": r.request.frames,
                    "priority": r.request.priority,
                    "latency_s": r.latency,
                    "met": r.met,
                    "degrees": {str(d): k for d, k in sorted(r.degrees.items())},
                }
                for r in result.records
            ]
    steps: dict[str, int] = {}
    for r in records:
        for d, k in r.degrees.items():
            steps[str(d)] = steps.get(str(d), 0) + k
    out = {
        "policy": policy,
        "workload": scenario.workload,
        "load": load,
        "device": scenario.cost.name,
        "devices": scenario.devices,
        "baseline_degree": baseline_degree if policy in STATIC else None,
        "arrival": scenario.arrival,
        "slo_scale": scenario.slo_scale,
        "noise": scenario.noise,
        "bias": scenario.bias,
        "bias_by": dict(scenario.bias_by),
        "seeds": list(scenario.seeds),
        "decisions": decisions,
        "max_s": max(r.latency for r in records),
        "migrations": sum(r.migrations for r in records) / len(records),
        "steps_by_degree": dict(sorted(steps.items(), key=lambda kv: int(kv[0]))),
    }
    if promised:
        out["promises_kept"] = kept / promised
        out["promise_late_max_s"] = late_by
    out.update(summarize(records))
    if scenario.per_request:
        out["per_request"] = per_request
    return out


def node_goodput(
    scenario: NodeScenario,
    policy: str,
    baseline_degree: int = 1,
    *,
    target: float = 0.99,
    lo: float = 0.05,
    hi: float = 1.2,
    tol: float = 0.01,
) -> float:
    """Highest ρ in [lo, hi] (to ``tol``) holding attainment ≥ ``target`` (bisection;
    attainment taken as falling with load); 0.0 if even ``lo`` fails."""

    def holds(load: float) -> bool:
        row = run_node_point(scenario, policy, load, baseline_degree)
        return row["slo_attainment"] >= target

    return highest_load(holds, lo, hi, tol)


def node_bound(scenario: NodeScenario, load: float, *, latency: bool = False) -> dict:
    """The bound and the clairvoyant reference at ``load`` over the scenario's seeds:
    ``{"requests", "bound_attainment", "clairvoyant_attainment"}`` (pooled); with
    ``latency``, also the latency bounds no schedule beats on the pooled requests:
    ``p95_floor_s`` (the P95 of each request's least latency) and ``p95_bound_s``,
    ``p99_bound_s``, ``max_bound_s`` (the floor with the node's capacity; bound.py)."""
    total = lower = clair = 0
    node = scenario.node()
    traces = []
    for seed in scenario.seeds:
        reqs = scenario.requests_for(load, seed)
        traces.append(reqs)
        ncost = NodeCost(scenario.cost)
        total += len(reqs)
        lower += min_node_misses(reqs, ncost, scenario.devices, node.degrees)
        clair += clairvoyant_node_misses(reqs, ncost, scenario.devices)
    out = {
        "requests": total,
        "bound_attainment": 1 - lower / total,
        "clairvoyant_attainment": 1 - clair / total,
    }
    if latency:
        ncost = NodeCost(scenario.cost)
        pooled = [r for t in traces for r in t]
        out["p95_floor_s"] = latency_floor(pooled, ncost, node.degrees, 95)
        for key, q in (("p95_bound_s", 95), ("p99_bound_s", 99), ("max_bound_s", 100)):
            out[key] = latency_bound(traces, ncost, scenario.devices, node.degrees, q)
    return out


def bound_goodput(scenario: NodeScenario, *, target: float = 0.99, lo: float = 0.05,
                  hi: float = 1.2, tol: float = 0.01) -> float:
    """Highest ρ in [lo, hi] (to ``tol``) at which the bound still allows ``target``
    attainment (bisection); 0.0 if even ``lo`` fails."""

    def allows(load: float) -> bool:
        return node_bound(scenario, load)["bound_attainment"] >= target

    return highest_load(allows, lo, hi, tol)
