"""Experiments over the simulator: one operating point, goodput by bisection, load sweeps.

A *point* is (workload or trace, policy, device, load, arrival process, seeds): every seed
is simulated and the records are pooled before the metrics are taken.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from .cost import CostModel
from .metrics import summarize
from .noise import DEFAULT_SIGMA, TimingNoise
from .plan import StepReport
from .policies import make_policy
from .request import Request
from .simulator import simulate
from .workloads import with_load, workload


@dataclass(slots=True)
class Scenario:
    """What to simulate, besides the policy and the load.

    Either ``workload`` (a name) or ``trace`` (parsed requests; ``trace_timed`` when they
    carry timestamps, in which case the load is the trace's own and ``load`` is ignored).
    ``noise``, ``bias`` and ``bias_by``: the simulated device's timing error around the
    profile (``TimingNoise``, seeded per trace seed; 0, 0 and none: exact).
    """

    cost: CostModel
    workload: str | None = None
    trace: list[Request] | None = None
    trace_timed: bool = False
    requests: int | None = None
    arrival: str = "poisson"
    slo_scale: float = 3.0
    scale: str = "gpu"
    seeds: tuple[int, ...] = (0,)
    policy_options: dict[str, dict] = field(default_factory=dict)
    label: str | None = None
    preemption: str = "step"
    decode: str = "inline"
    block_chunk: int | None = None
    noise: float = DEFAULT_SIGMA
    bias: float = 0.0
    bias_by: dict[str, float] = field(default_factory=dict)

    def timing_noise(self, seed: int) -> TimingNoise:
        """The device's timing noise for the trace of ``seed`` (the same for every policy)."""
        return TimingNoise(sigma=self.noise, bias=self.bias, seed=seed, bias_by=self.bias_by)

    def requests_for(self, load: float, seed: int) -> list[Request]:
        """The request list for one seed at ``load``."""
        if self.workload is not None:
            return workload(
                self.workload,
                self.cost,
                load=load,
                requests=self.requests,
                seed=seed,
                arrival=self.arrival,
                slo_scale=self.slo_scale,
                scale=self.scale,
            )
        if self.trace is None:
            raise ValueError("a scenario needs a workload name or a trace")
        base = self.trace[: self.requests] if self.requests else self.trace
        if self.trace_timed:
            out = []
            for r in base:
                out.append(self.cost.assign_deadline(r.resubmitted(r.arrival), self.slo_scale))
            return out
        return with_load(
            base, self.cost, load, seed=seed, arrival=self.arrival, slo_scale=self.slo_scale
        )

    def name(self) -> str:
        return self.label or self.workload or "trace"


def measured_load(requests: list[Request], cost: CostModel) -> float:
    """Offered load of a timed request list: Σ standalone time / arrival span."""
    span = max(r.arrival for r in requests) - min(r.arrival for r in requests)
    work = sum(cost.standalone_time(r) for r in requests)
    return work / span if span > 0 else float("inf")


def run_point(
    scenario: Scenario,
    policy: str,
    load: float,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Simulate every seed at ``load`` under ``policy``; pooled metrics plus descriptors."""
    records = []
    chunks = parks = 0
    link_s = 0.0
    for seed in scenario.seeds:
        reqs = scenario.requests_for(load, seed)
        pol = make_policy(policy, scenario.cost.fresh(),
                          **scenario.policy_options.get(policy, {}))
        pol.fixed_chunk = scenario.block_chunk
        result = simulate(
            reqs,
            pol,
            slo_scale=scenario.slo_scale,
            progress=progress,
            preemption=scenario.preemption,
            decode=scenario.decode,
            noise=scenario.timing_noise(seed),
        )
        records += result.records
        chunks += result.chunks
        parks += result.parks
        link_s += result.link_busy_s
    out = {
        "policy": policy,
        "workload": scenario.name(),
        "load": load,
        "device": scenario.cost.name,
        "arrival": scenario.arrival,
        "slo_scale": scenario.slo_scale,
        "seeds": list(scenario.seeds),
        "preemption": scenario.preemption,
        "decode": scenario.decode,
        "block_chunk": scenario.block_chunk,
        "noise": scenario.noise,
        "bias": scenario.bias,
        "bias_by": dict(scenario.bias_by),
        "chunks": chunks,
        "parks": parks,
        "link_busy_s": link_s,
    }
    out.update(summarize(records))
    return out


class _Recording:
    """A policy that remembers every executed iteration: (start, end, batch ids); the start
    leaves out idle time (and a block preemption point's small overhead)."""

    def __init__(self, inner):
        self.inner = inner
        self.steps: list[tuple[float, float, list[str]]] = []

    def observe(self, report: StepReport) -> None:
        busy = report.step_s + report.encode_s + report.decode_s + report.transfer_s
        self.steps.append((report.now - busy, report.now, list(report.batch)))
        self.inner.observe(report)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def explain_misses(scenario: Scenario, policy: str, load: float, priority: int = 0) -> list[dict]:
    """Every missed request of ``priority`` with what the device ran during its SLO window:
    ``ran`` maps ``"<width>² p<priority> <due before|after>"`` (relative to the missed
    request's deadline; ``self`` for its own steps) to device seconds, most first."""
    out = []
    for seed in scenario.seeds:
        reqs = scenario.requests_for(load, seed)
        by_id = {r.id: r for r in reqs}
        pol = make_policy(policy, scenario.cost.fresh(),
                          **scenario.policy_options.get(policy, {}))
        rec = _Recording(pol)
        result = simulate(
            reqs, rec, slo_scale=scenario.slo_scale, noise=scenario.timing_noise(seed)
        )
        for record in result.records:
            r = record.request
            if r.priority != priority or record.met:
                continue
            ran: Counter[str] = Counter()
            for start, end, batch in rec.steps:
                overlap = min(end, r.deadline) - max(start, r.arrival)
                for rid in batch if overlap > 0 else ():
                    o = by_id[rid]
                    due = "before" if o.deadline <= r.deadline else "after"
                    tag = "self" if rid == r.id else f"{o.width}² p{o.priority} due {due}"
                    ran[tag] += overlap / len(batch)
            out.append(
                {
                    "seed": seed,
                    "id": r.id,
                    "shape": f"{r.width}x{r.height}x{r.frames}, {r.steps} steps",
                    "arrival_s": r.arrival,
                    "window_s": r.deadline - r.arrival,
                    "late_by_s": record.finished - r.deadline,
                    "ran": dict(ran.most_common()),
                }
            )
    return out


def goodput(
    scenario: Scenario,
    policy: str,
    *,
    target: float = 0.99,
    lo: float = 0.05,
    hi: float = 1.2,
    tol: float = 0.01,
) -> float:
    """Highest load (in [lo, hi], to ``tol``) at which attainment stays ≥ ``target``, by
    bisection (attainment is taken as falling with load). 0.0 if even ``lo`` fails."""

    return highest_load(
        lambda load: run_point(scenario, policy, load)["slo_attainment"] >= target,
        lo, hi, tol)


def highest_load(holds: Callable[[float], bool], lo: float, hi: float, tol: float) -> float:
    """The highest load in ``[lo, hi]`` (to ``tol``) where ``holds(load)``, by bisection
    (``holds`` taken as true below some load and false above); 0.0 if ``holds(lo)`` fails."""
    if not holds(lo):
        return 0.0
    if holds(hi):
        return hi
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return round(lo, 4)


def plot_sweep(rows: list[dict], path: str, title: str) -> None:
    """Attainment and P95 versus load, one line per policy (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for policy in dict.fromkeys(r["policy"] for r in rows):
        pts = sorted((r["load"], r) for r in rows if r["policy"] == policy)
        loads = [p[0] for p in pts]
        ax1.plot(loads, [100 * p[1]["slo_attainment"] for p in pts], marker="o", label=policy)
        ax2.plot(loads, [p[1]["p95_s"] for p in pts], marker="o", label=policy)
    ax1.axhline(99, color="grey", linestyle="--", linewidth=1)
    ax1.set(xlabel="load ρ", ylabel="SLO attainment (%)", title="attainment vs load")
    ax2.set(xlabel="load ρ", ylabel="P95 latency (s)", title="P95 vs load", yscale="log")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
