"""``ditmem sim --devices D``: the node simulator behind the ``sim`` command.

    ditmem sim --workload seed-mix --devices 8 --policy fifo,srtf,elastic-np,slo \\
               [--baseline-degree 1[,2,4,8]] --load 0.7 --device h200 --seeds 5 \\
               [--noise 0.03] [--bias 0 | KIND[:CLASS]=B,...] [--bound] [--json OUT] \\
               [--sweep --plot OUT.png]

On D devices ``--load ρ`` is arrival rate × mean standalone time at degree 1 ÷ D. ``fifo``
and ``srtf`` run on D/d static replicas of degree d (``--baseline-degree``, a comma list
gives one row per degree); ``elastic-np`` and ``slo`` choose degrees themselves. ``--json``
rows carry ``devices``, ``baseline_degree``, ``steps_by_degree`` and ``per_request`` (each
request's degrees). ``--sweep`` runs ρ 0.5 … 0.95 (plus 1.0 and 1.1: a node holds more),
plots attainment and P95 against ρ for every policy, and bisects each one's goodput.
"""

from __future__ import annotations

from ..cli import SIM_ERRORS, fail, write_rows
from ..cost import CostModel
from ..experiment import plot_sweep
from ..noise import TimingNoise
from .experiment import NodeScenario, bound_goodput, node_bound, node_goodput, run_node_point
from .policies import NODE_POLICIES, STATIC

SWEEP_LOADS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1)
HEADER = (
    f"{'policy':<13} {'workload':<15} {'load':>5} {'D':>2} {'requests':>8} {'att%':>7} "
    f"{'p0%':>7} {'P50 s':>8} {'P95 s':>8} {'P99 s':>8} {'max s':>8} {'mean deg':>8}"
)


def _label(row: dict) -> str:
    d = row["baseline_degree"]
    return row["policy"] if d is None else f"{row['policy']} d={d}"


def _line(row: dict) -> str:
    p0 = row["per_priority"]["0"]["slo_attainment"]
    steps = row["steps_by_degree"]
    total = sum(steps.values()) or 1
    mean_degree = sum(int(d) * k for d, k in steps.items()) / total
    return (
        f"{_label(row):<13} {row['workload']:<15} {row['load']:5.2f} {row['devices']:2d} "
        f"{row['requests']:8d} {100 * row['slo_attainment']:7.2f} "
        f"{'-' if p0 is None else f'{100 * p0:.2f}':>7} {row['p50_s']:8.2f} "
        f"{row['p95_s']:8.2f} {row['p99_s']:8.2f} {row['max_s']:8.2f} {mean_degree:8.2f}"
    )


def _degrees(text: str, devices: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 or v & (v - 1) or v > devices for v in values):
        raise ValueError(
            f"--baseline-degree: powers of two <= --devices {devices} (comma list), got {text!r}"
        )
    return values


def node_main(args, options: dict[str, dict]) -> int:
    """Run the ``sim`` command on a node (``args.devices`` set); returns the exit code."""
    try:
        if args.devices < 1:
            raise ValueError(f"--devices must be >= 1, got {args.devices}")
        if args.workload is None:
            raise ValueError("--devices needs --workload (traces are not supported on a node yet)")
        if args.preemption != "step" or args.decode != "inline":
            raise ValueError("--devices supports --preemption step and --decode inline only")
        TimingNoise(args.noise, args.bias, 0, args.bias_by)
        policies = [p.strip() for p in args.policy.split(",") if p.strip()]
        unknown = [p for p in policies if p not in NODE_POLICIES]
        if unknown or not policies:
            raise ValueError(
                f"--policy: unknown {unknown}; on a node choose from {', '.join(NODE_POLICIES)}"
            )
        degrees = _degrees(args.baseline_degree or "1", args.devices)
        scenario = NodeScenario(
            CostModel.load(args.device),
            args.devices,
            args.workload,
            requests=args.requests,
            seeds=tuple(range(args.seed, args.seed + max(1, args.seeds))),
            arrival=args.arrival,
            slo_scale=args.slo_scale,
            scale=args.scale,
            noise=args.noise,
            bias=args.bias,
            policy_options=options,
            per_request=bool(args.json),
            bias_by=args.bias_by,
        )
        runs = [(p, d) for p in policies for d in (degrees if p in STATIC else [1])]
        loads = list(SWEEP_LOADS) if args.sweep else [args.load]
        rows = []
        print(HEADER)
        for load in loads:
            for policy, degree in runs:
                row = run_node_point(scenario, policy, load, degree)
                rows.append(row)
                print(_line(row), flush=True)
            if args.bound:
                b = node_bound(scenario, load)
                print(
                    f"bound  load {load:.2f}: any policy on {args.devices} devices <= "
                    f"{100 * b['bound_attainment']:.2f} % attainment; clairvoyant EDF on the "
                    f"relaxed machine {100 * b['clairvoyant_attainment']:.2f} %"
                )
                for row in rows[-len(runs):]:
                    row.update(b)
        if args.sweep:
            goodputs = {}
            for policy, degree in runs:
                g = node_goodput(scenario, policy, degree)
                label = policy if policy not in STATIC else f"{policy} d={degree}"
                goodputs[label] = g
                print(f"goodput {label}: {g:.3f} (highest load with >= 99 % attainment)")
            gb = bound_goodput(scenario)
            print(f"goodput allowed by the bound: {gb:.3f}")
            for row in rows:
                row["goodput"] = goodputs[_label(row)]
                row["bound_goodput"] = gb
            labelled = [dict(r, policy=_label(r)) for r in rows]
            title = (
                f"{scenario.workload} on {args.devices} x {scenario.cost.name}, "
                f"{args.arrival} arrivals, noise {args.noise}"
            )
            plot_sweep(labelled, args.plot, title)
            print(f"plot: {args.plot}")
        return write_rows(rows, args.json)
    except SIM_ERRORS as exc:  # NodeProfileError is a ValueError
        return fail(exc)
