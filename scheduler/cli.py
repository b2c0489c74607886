"""``ditmem sim``: simulate scheduling policies on a device profile.

    ditmem sim --workload seed-mix --policy fifo,srtf,slo --load 0.8 --device h200 \\
               [--arrival poisson|gamma:CV] [--requests N] [--seed S] [--seeds K] \\
               [--slo-scale 3] [--json OUT] [--sweep [--plot OUT.png]] [--bound]
               [--preemption step|block [--block-chunk K]] [--noise SIGMA]
               [--bias B | --bias KIND[:CLASS]=B,...]

Prints one row per policy. ``--json`` writes a list of objects (one per policy and load)
with ``policy, workload, load, device, requests, slo_attainment, p50_s, p95_s, p99_s,
max_s, mean_s, noise, bias, bias_by, preemptions, per_priority`` ({"0","1","2"} →
{slo_attainment, p95_s, p99_s}) and more. ``--sweep`` runs ρ = 0.5 … 0.95, draws
attainment and P95 against load (PNG) and prints each policy's goodput (highest load
holding ≥ 99 % attainment, by bisection).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .bound import clairvoyant_misses, min_misses
from .cost import CostModel
from .experiment import Scenario, goodput, measured_load, plot_sweep, run_point
from .noise import DEFAULT_SIGMA, KINDS, TimingNoise, parse_bias
from .policies import POLICIES
from .profiles import ProfileError
from .traces import TraceError, load_trace
from .workloads import WORKLOADS

#: What a ``sim`` command reports as a usage error (exit status 2) instead of a traceback.
SIM_ERRORS = (ValueError, ProfileError, TraceError, OSError)

SWEEP_LOADS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", choices=WORKLOADS, help="a named workload")
    src.add_argument("--trace", help="a trace file: Request(...) lines or JSONL")
    parser.add_argument("--policy", default="fifo,srtf,slo", help="comma list (fifo,srtf,slo)")
    parser.add_argument("--load", type=float, default=0.8, help="target load ρ (default 0.8)")
    parser.add_argument("--arrival", default="poisson", help="poisson | gamma:CV")
    parser.add_argument("--device", default="h200", help="profile name or profile .json path")
    parser.add_argument("--requests", type=int, help="requests per seed (default: workload's)")
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--seeds", type=int, default=1, help="number of seeds (default 1)")
    parser.add_argument("--slo-scale", type=float, default=3.0, help="SLO = scale × standalone")
    parser.add_argument(
        "--scale",
        choices=("gpu", "cpu"),
        default="gpu",
        help="cpu: halve every pixel dimension (tiny CPU models)",
    )
    parser.add_argument("--json", metavar="OUT", help="write results as a JSON list")
    parser.add_argument("--sweep", action="store_true", help="sweep ρ 0.5-0.95 and goodput")
    parser.add_argument("--plot", default="sim_sweep.png", help="PNG for --sweep")
    parser.add_argument(
        "--bound",
        action="store_true",
        help="also report the offline bound on attainment (any policy)",
    )
    parser.add_argument(
        "--opt",
        action="append",
        default=[],
        metavar="POLICY.KEY=VALUE",
        help="policy option, e.g. slo.rescue0=0.3 (repeatable)",
    )
    parser.add_argument(
        "--preemption",
        choices=("step", "block"),
        default="step",
        help="pause only between steps, or also between chunks of transformer blocks",
    )
    parser.add_argument(
        "--block-chunk",
        type=int,
        metavar="K",
        help="with --preemption block: K blocks per chunk (default: chosen from the cost model)",
    )
    parser.add_argument(
        "--decode",
        choices=("inline", "concurrent", "tiled"),
        default="inline",
        help="VAE decode: whole on the step loop after the last step (inline, default), on "
        "a worker beside it sharing the device (concurrent), or one spatial tile at a time "
        "between steps when it is due first, a late one with about a 0.1 share of the loop "
        "(tiled; needs the profile's decode_tile_* numbers)",
    )
    parser.add_argument(
        "--noise",
        type=float,
        default=DEFAULT_SIGMA,
        metavar="SIGMA",
        help="the simulated device's timing noise: every step, encode, decode and transfer "
        "takes its predicted time × a lognormal draw of this spread (default 0.03; 0: exact)",
    )
    parser.add_argument(
        "--bias",
        type=bias_arg,
        default="0",
        metavar="B|KIND[:CLASS]=B,...",
        help="systematic timing error of the simulated device (0.1: 10 %% slower than the "
        "profile; the policy only learns it through its online correction). By kind and "
        f"class: KIND one of {', '.join(KINDS)}; CLASS a shape (step:2048x2048, "
        "decode:1280x720x81), a node step's degree (step:d2) or a node move's kind "
        "(move:peer); a class's bias multiplies its kind's, a bare number is the bias of "
        "every kind not listed (e.g. 0.05,move=1.42,step:d2=-0.1)",
    )
    parser.add_argument(
        "--devices",
        type=int,
        metavar="D",
        help="simulate a node of D devices (ditmem.scheduler.node): policies fifo, srtf, "
        "elastic-np, slo; --load is then arrival rate x mean standalone time at degree 1 / D",
    )
    parser.add_argument(
        "--baseline-degree",
        metavar="d[,d...]",
        help="with --devices: the fixed degree of fifo's and srtf's D/d static replicas "
        "(default 1; a comma list runs each)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        metavar="R",
        help="simulate R replicas (nodes of --devices, default 1) behind a router "
        "(ditmem.scheduler.cluster); --load is then per device",
    )
    parser.add_argument(
        "--router",
        default="ditmem,round-robin,pow2",
        help="with --replicas: comma list of ditmem, round-robin, pow2 (default all)",
    )
    parser.add_argument(
        "--report-s",
        type=float,
        default=2.0,
        help="with --replicas: seconds between the replicas' reports to the router",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def bias_arg(text: str) -> str:
    """``--bias``'s argparse type: the text, once ``noise.parse_bias`` accepts it (its
    ValueError, naming the bad item, becomes the usage error)."""
    try:
        parse_bias(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def split_bias(value: str | float) -> tuple[float, dict[str, float]]:
    """``--bias``'s value (text, or a number) as (plain bias, bias by kind and class)."""
    if isinstance(value, str):
        return parse_bias(value)
    return float(value), {}


def parse_options(items: list[str]) -> dict[str, dict]:
    """``--opt POLICY.KEY=VALUE`` items as {policy: {key: value}}: VALUE is JSON (``0.5``,
    ``true``, ``"edf"``), ``None``, or else the bare string (``slo.late_rank=arrival``); the policy
    checks the value and names the option when it is wrong."""
    out: dict[str, dict] = {}
    for item in items:
        try:
            target, value = item.split("=", 1)
            policy, key = target.split(".", 1)
        except ValueError:
            raise ValueError(f"--opt {item!r}: expected POLICY.KEY=VALUE") from None
        if not policy or not key:
            raise ValueError(f"--opt {item!r}: expected POLICY.KEY=VALUE")
        out.setdefault(policy, {})[key] = _option_value(value)
    return out


def _option_value(text: str):
    if text == "None":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _scenario(args) -> Scenario:
    if args.block_chunk is not None:
        if args.preemption != "block":
            raise ValueError("--block-chunk needs --preemption block")
        if args.block_chunk < 1:
            raise ValueError(f"--block-chunk must be >= 1, got {args.block_chunk}")
    cost = CostModel.load(args.device)
    seeds = tuple(range(args.seed, args.seed + max(1, args.seeds)))
    common = dict(
        cost=cost,
        requests=args.requests,
        arrival=args.arrival,
        slo_scale=args.slo_scale,
        scale=args.scale,
        seeds=seeds,
        policy_options=parse_options(args.opt),
        preemption=args.preemption,
        block_chunk=args.block_chunk,
        decode=args.decode,
        noise=args.noise,
        bias=args.bias,
        bias_by=args.bias_by,
    )
    try:
        TimingNoise(args.noise, args.bias, 0, args.bias_by)
    except ValueError as exc:
        raise ValueError(f"--noise/--bias: {exc}") from None
    if args.workload:
        return Scenario(workload=args.workload, **common)
    trace = load_trace(args.trace)
    label = Path(args.trace).stem
    return Scenario(trace=trace.requests, trace_timed=trace.has_timestamps, label=label, **common)


def _row(r: dict) -> str:
    pp = r["per_priority"]
    att = " ".join(
        f"{100 * pp[p]['slo_attainment']:6.2f}" if pp[p]["slo_attainment"] is not None else "     -"
        for p in ("0", "1", "2")
    )
    return (
        f"{r['policy']:<6} {r['workload']:<13} {r['load']:5.2f} {r['device']:<11} "
        f"{r['requests']:6d} {100 * r['slo_attainment']:7.2f}  {att} {r['p50_s']:8.2f} "
        f"{r['p95_s']:8.2f} {r['p99_s']:8.2f} {r['max_s']:8.1f} {r['mean_s']:8.2f} "
        f"{r['preemptions']:6.2f}"
    )


HEADER = (
    f"{'policy':<6} {'workload':<13} {'load':>5} {'device':<11} {'reqs':>6} "
    f"{'att%':>7}  {'p0%':>6} {'p1%':>6} {'p2%':>6} {'P50 s':>8} {'P95 s':>8} "
    f"{'P99 s':>8} {'max s':>8} {'mean s':>8} {'preem':>6}"
)


def _progress(args, total: int):
    if args.quiet or not sys.stderr.isatty():
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=total, unit="req", file=sys.stderr, leave=False)
    state = {"last": 0}

    def update(done: int, _total: int) -> None:
        if done < state["last"]:
            state["last"] = 0
        bar.update(done - state["last"])
        state["last"] = done

    return bar, update


def fail(message: object) -> int:
    """Print ``message`` as the ``sim`` command's error; returns its exit status (2)."""
    print(f"ditmem sim: error: {message}", file=sys.stderr)
    return 2


def write_rows(rows: list[dict], path: str | None) -> int:
    """Write the result rows as a JSON list to ``path`` (None: nowhere); returns 0."""
    if path:
        with open(path, "w") as fh:
            json.dump(rows, fh, indent=2)
        print(f"json: {path}")
    return 0


def main(args) -> int:
    try:
        args.bias, args.bias_by = split_bias(args.bias)
    except ValueError as exc:
        return fail(exc)
    if getattr(args, "replicas", None) is not None:
        if args.bias_by:
            return fail("--bias KIND[:CLASS]=B: not supported with --replicas (give one number)")
        from .cluster_cli import cluster_main

        return cluster_main(args)
    if getattr(args, "devices", None) is not None:
        from .node.cli import node_main

        try:
            options = parse_options(args.opt)
        except ValueError as exc:
            return fail(exc)
        return node_main(args, options)
    if getattr(args, "baseline_degree", None) is not None:
        return fail("--baseline-degree needs --devices")
    try:
        policies = [p.strip() for p in args.policy.split(",") if p.strip()]
        unknown = [p for p in policies if p not in POLICIES]
        if unknown or not policies:
            raise ValueError(f"--policy: unknown {unknown}; choose from {', '.join(POLICIES)}")
        scenario = _scenario(args)
        loads = list(SWEEP_LOADS) if args.sweep else [args.load]
        if scenario.trace_timed:
            loads = [measured_load(scenario.requests_for(0.0, 0), scenario.cost)]
        n = len(scenario.requests_for(loads[0], scenario.seeds[0]))
        bar, progress = _progress(args, n * len(scenario.seeds) * len(policies) * len(loads))
        rows = []
        print(HEADER)
        for load in loads:
            for policy in policies:
                row = run_point(scenario, policy, load, progress)
                row["timed_trace"] = scenario.trace_timed
                rows.append(row)
                line = _row(row)
                print(line if bar is None else line, flush=True)
        if bar is not None:
            bar.close()
        if args.bound:
            _print_bound(scenario, loads)
        if args.sweep and not scenario.trace_timed:
            for policy in policies:
                g = goodput(scenario, policy)
                for row in rows:
                    if row["policy"] == policy:
                        row["goodput"] = g
                print(f"goodput {policy}: {g:.3f} (highest load with >= 99 % attainment)")
            title = f"{scenario.name()} on {scenario.cost.name}, {args.arrival} arrivals"
            plot_sweep(rows, args.plot, title)
            print(f"plot: {args.plot}")
        return write_rows(rows, args.json)
    except SIM_ERRORS as exc:
        return fail(exc)


def _print_bound(scenario: Scenario, loads: list[float]) -> None:
    for load in loads:
        total = lower = clair = 0
        for seed in scenario.seeds:
            reqs = scenario.requests_for(load, seed)
            total += len(reqs)
            lower += min_misses(reqs, scenario.cost)
            clair += clairvoyant_misses(reqs, scenario.cost)
        print(
            f"bound  load {load:.2f}: any policy <= {100 * (1 - lower / total):.2f} % "
            f"attainment; clairvoyant EDF-with-give-up reaches {100 * (1 - clair / total):.2f} %"
        )
