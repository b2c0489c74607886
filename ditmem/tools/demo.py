"""``ditmem demo``: the CPU-scaled seed-mix replayed in-process under fifo and slo.

One trace (fixed seed, Poisson arrivals at load ρ computed with the ``--profile`` cost
model) is replayed in real time against a fresh engine per policy over the same loaded
``tiny-qwen-image`` generator; the comparison is printed side by side, plotted, and written
as JSON with ``ditmem sim``'s metric fields. Nothing is simulated: every step runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ditmem.engine.factory import add_model_arguments
from ditmem.engine.threads import add_threads_argument, set_torch_threads
from ditmem.tools.demo_runs import decode_mode, decode_tile
from ditmem.tools.profile import add_decode_tile_argument
from ditmem.tools.profile_check import report, work_ratio
from ditmem.tools.report import comparison_table, run_summary
from ditmem.tools.run_speed import describe, one_device_references, speed_factors


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny-qwen-image")
    p.add_argument("--profile", default="measure",
                   help="'measure' (default: measure this machine now, so that the target "
                        "load is the real load here), a profile JSON from `ditmem profile` "
                        "(e.g. benchmarks/serving/cpu-tiny-measured.json, to replay the "
                        "development machine's trace), or a profile name")
    p.add_argument("--profile-out", default="demo_profile.json",
                   help="where the measured profile is saved (with --profile measure)")
    p.add_argument("--profile-encodes", choices=("back-to-back", "after-step"),
                   default="back-to-back",
                   help="with --profile measure: time the profile's encodes back to back "
                        "(default) or each right after a step of another request, the order "
                        "a run meets them in (an option: not yet shown to match the runs "
                        "better; docs/results/profile.md)")
    p.add_argument("--workload", default="seed-mix")
    p.add_argument("--load", type=float, default=0.8, help="target load rho")
    p.add_argument("--requests", type=int, default=150)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arrival", default="poisson", help="poisson | gamma:CV")
    p.add_argument("--divisor", type=int, default=2,
                   help="pixel divisor from the GPU shapes (2: 512->256, 1024->512, "
                        "2048->1024, where the largest request takes >= 20x the smallest, "
                        "as on a GPU; 8 is about 5x faster but only ~5x)")
    p.add_argument("--policies", default="fifo,slo")
    p.add_argument("--devices", type=int, default=1,
                   help="N > 1: the node demo on N device workers (CPU: processes pinned to "
                        "cores, N <= cores): fifo on N static replicas, then slo with "
                        "elastic degree and migration (ditmem.tools.node_demo)")
    p.add_argument("--parallel-clock", choices=("cpu", "process", "wall"), default="wall",
                   help="with --devices N: the start-up speed-up table on the workers' wall "
                        "time (default: what the replays run on), main-thread CPU time or "
                        "all-thread CPU time (busy-time clocks leave out the waits of an "
                        "exchange: on this CPU they put degree 2 x1.1-1.2 faster than the "
                        "replays ran it)")
    p.add_argument("--pool-mb", type=float, default=64.0)
    add_model_arguments(p, memory=False)
    p.add_argument("--decode-workers", type=int, choices=(0, 1), default=0,
                   help="1: VAE decode on a worker thread beside the step loop (earliest "
                        "deadline first; simulated as `--decode concurrent`)")
    p.add_argument("--decode", choices=("auto", "inline", "tiled"), default="auto",
                   help="auto (default): fifo decodes right after the last step (run to "
                        "completion), the other policies tile by tile between steps when "
                        "a decode is due first; inline / tiled: the same for every policy")
    add_decode_tile_argument(p, "VAE decode tiles in pixels for every policy ('none': whole)")
    p.add_argument("--page-kb", type=int, default=64)
    p.add_argument("--plot", default="demo.png", help="PNG path ('' to skip)")
    p.add_argument("--json", default=None, help="write results JSON here")
    p.add_argument("--decisions", default=None,
                   help="write every policy decision of each replay here (JSON: per policy, "
                        "one row per decision: now (s, the replay's clock), batch, admit, "
                        "offload, restore, late ids, active/waiting counts, ran (ids stepped; "
                        "null: no step report, e.g. a decode tile ran), step_s and the ids "
                        "decoding (tiled decodes pending); read by benchmarks/scheduler/"
                        "demo_misses.py --decisions. With --devices N: per policy, 'run' "
                        "and 'sim' (its simulator replay), each with 'decisions' (now, "
                        "jobs [id, devices, last job, largest tier], placed, late, waiting, "
                        "paused ids) and 'take_backs' (now, spares offered, granted); read "
                        "by benchmarks/parallel/node_demo_misses.py)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--mode", choices=("parallel", "sequential"), default="parallel",
                   help="parallel (default): one process per policy, each pinned to its own "
                        "core when there are enough, replays started together (both see "
                        "the same background load); sequential: one after the other here")
    add_threads_argument(p)


def build_trace(args, cost, exact_load: bool = True, devices: int = 1):
    """The demo's requests: the named workload at ``--load`` per device on ``devices``,
    shapes divided by ``--divisor``, arrivals/deadlines from ``cost``. ``exact_load``: the
    arrivals scaled so the trace's own load is ``--load`` (``workloads.at_load``; since
    session 17); False: the sample as drawn, as the demos replayed it before (``"exact_load"``
    in a saved run's JSON says which)."""
    from ditmem.scheduler.workloads import at_load, with_load, workload

    total = args.load * devices
    reqs = workload(args.workload, cost, load=total, requests=args.requests,
                    seed=args.seed, arrival=args.arrival, scale="gpu")
    for r in reqs:
        r.width = max(16, r.width // args.divisor // 16 * 16)
        r.height = max(16, r.height // args.divisor // 16 * 16)
    reqs = with_load(reqs, cost, total, seed=args.seed, arrival=args.arrival)
    return at_load(reqs, cost, args.load, devices=devices) if exact_load else reqs


def demo_sides(args) -> list[int]:
    """The square sides of the demo's trace (the workload's shapes ÷ ``--divisor``)."""
    from ditmem.scheduler.workloads import MIXES

    return sorted({max(16, s.width // args.divisor // 16 * 16)
                   for s in MIXES[args.workload].shapes})


def measure_demo_profile(gen, args) -> dict:
    """The device profile for the demo's shapes, measured by this process now (the machine
    may be shared: the load must be relative to today's speed)."""
    from ditmem.tools.profile import measure_profile

    return measure_profile(gen, args.model, demo_sides(args), [1, 2, 4], 5, pool_mb=args.pool_mb,
                           page_kb=args.page_kb, tool="ditmem demo", log=lambda *_: None,
                           decode_tile=decode_tile(args, gen),
                           encode_order=getattr(args, "profile_encodes", "back-to-back"))


def retime_decodes(profile: dict, gen, args, index: int, barrier, done) -> dict:
    """``profile`` (this replay process's, measured while the others measured theirs) with
    its decode figures from the tile timed again while the other processes run steps of
    the middle side, in turns (:mod:`ditmem.tools.decode_beside`: a decode's neighbour in
    the run); unchanged for one process or a model that does not tile."""
    from ditmem.engine.factory import EngineConfig, make_pools
    from ditmem.tools.decode_beside import (
        StepBackground,
        decode_sample,
        rescale_decodes,
        time_in_turns,
    )

    tile = decode_tile(args, gen)
    if len(done) < 2 or tile is None:
        return profile
    sides = demo_sides(args)
    middle = sides[len(sides) // 2]
    pool, _ = make_pools(EngineConfig(pool_mb=args.pool_mb, page_kb=args.page_kb), "cpu")
    background = StepBackground(gen, pool, middle)
    try:
        tile_s = time_in_turns(index, len(done), barrier, done,
                               decode_sample(gen, pool, tile[0]), background, 4,
                               what=f"decode {tile[0]}x{tile[0]} beside steps")
    finally:
        background.release()
    return rescale_decodes(profile, tile_s, f"while the other replay processes ran "
                                            f"{middle}x{middle} steps")


def calibrate(gen, args) -> str:
    """Measure the device profile here (sequential mode: this process runs the replays);
    returns the saved JSON path."""
    print("measuring the device profile in this process ...", flush=True)
    return save_profile(measure_demo_profile(gen, args), args)


def save_profile(profile: dict, args) -> str:
    """Write ``profile`` to ``--profile-out``; its path."""
    with open(args.profile_out, "w") as f:
        json.dump(profile, f, indent=2)
    print(f"profile: {args.profile_out}")
    return args.profile_out


def predict(trace, policy: str, profile: str, page_bytes: int, pool_pages: int,
            decode: str = "inline") -> dict:
    """What ``ditmem sim`` (``scheduler.simulate``) predicts for this exact trace and pool:
    the simulated device draws its times around the profile (``TimingNoise``, 3 %, seed 0),
    from its own copy of the profile (the policy learns it only through what it observes)."""
    import dataclasses

    from ditmem.engine.factory import make_policy_and_cost
    from ditmem.scheduler import CostModel
    from ditmem.scheduler.metrics import summarize
    from ditmem.scheduler.noise import TimingNoise
    from ditmem.scheduler.simulator import simulate

    pol, cost = make_policy_and_cost(policy, profile)
    reqs = [dataclasses.replace(r) for r in trace]
    result = simulate(reqs, pol, CostModel(cost.base.profile), page_bytes=page_bytes,
                      device_pages=pool_pages, decode=decode, noise=TimingNoise(seed=0))
    return summarize(result.records)


def trace_limits(trace, cost) -> dict:
    """What the trace itself allows: the spread of standalone times, the offline bound on
    attainment (no policy can do better, packed steps charged in full:
    ``scheduler.bound.min_misses_packed``) and a clairvoyant schedule's attainment; and its
    own load at ``cost``'s times (``trace_load``: its arrival rate, as ``run_summary``
    counts it, x its mean standalone time — a finite sample's, not the requested one)."""
    import dataclasses

    from ditmem.scheduler.bound import clairvoyant_misses, min_misses_packed
    from ditmem.scheduler.workloads import trace_load

    reqs = [dataclasses.replace(r) for r in trace]
    alone = [cost.standalone_time(r) for r in reqs]
    n = len(reqs)
    try:
        load = trace_load(reqs, cost)
    except ValueError:  # one request, or all at once: no arrival rate to speak of
        load = float("nan")
    return {"standalone_ratio": max(alone) / min(alone), "trace_load": load,
            "bound_attainment": 1 - min_misses_packed(reqs, cost) / n,
            "clairvoyant_attainment": 1 - clairvoyant_misses(reqs, cost) / n}


def tail_criterion(trace, cost, results: dict) -> dict | None:
    """``tail_verdict.p99_verdict`` on ``trace`` at slo's run speed against fifo's measured
    P99 (None when the run lacks either policy, or, said on stderr, without scipy)."""
    from ditmem.scheduler import CostModel
    from ditmem.tools.run_speed import as_run, scale_profile
    from ditmem.tools.tail_verdict import p99_verdict

    if "slo" not in results or "fifo" not in results:
        return None
    run_cost = CostModel(scale_profile(cost.profile, results["slo"]["at_run_speed"]["factors"]))
    try:
        return p99_verdict(as_run(trace, run_cost), run_cost, results["fifo"]["p99_s"])
    except ImportError as e:
        print(f"tail criterion not checked: {e}", file=sys.stderr)
        return None


def main(args) -> int:
    from ditmem import models
    from ditmem.engine.factory import EngineConfig, make_pools, scheduler_model
    from ditmem.scheduler import CostModel

    if args.devices > 1:
        from ditmem.tools.node_demo import main as node_main

        return node_main(args)
    set_torch_threads(args.threads)
    if args.profile != "measure" and args.profile.endswith(".json") \
            and not Path(args.profile).is_file():
        print(f"ditmem demo: --profile {args.profile}: no such file", file=sys.stderr)
        return 2
    started = time.perf_counter()
    gen = models.load(args.model, dtype=args.dtype)
    model_key = scheduler_model(args.model, gen)
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    from ditmem.tools.demo_runs import run_parallel, run_policy, warm_up

    if args.mode == "parallel":  # the replay processes measure the profile themselves
        trace, outcomes = run_parallel(names, args, lambda: build_trace(
            args, CostModel.load(args.profile)))
    else:
        if args.profile == "measure":
            args.profile = calibrate(gen, args)
        trace = build_trace(args, CostModel.load(args.profile))
        pool, _ = make_pools(EngineConfig(pool_mb=args.pool_mb, page_kb=args.page_kb), "cpu")
        warm_up(gen, trace, pool)
        outcomes = {n: run_policy(gen, n, trace, args, model_key) for n in names}
    results = {}
    for name in names:
        o = outcomes[name]
        results[name] = run_summary(o["records"], o["services"], o["stats"], o["wall"],
                                    o["leaked"])
        sim = predict(trace, name, args.profile, o["page_bytes"], o["num_pages"],
                      "concurrent" if args.decode_workers else decode_mode(args, name, gen))
        results[name]["sim_slo_attainment"] = sim["slo_attainment"]
        results[name]["sim_p95_s"] = sim["p95_s"]
        results[name]["sim_p50_s"] = sim["p50_s"]
        results[name]["vs_profile"] = o["vs_profile"]
        results[name]["work_load"] = args.load * work_ratio(o["vs_profile"])
        results[name]["at_run_speed"] = one_device_references(
            trace, CostModel.load(args.profile).profile, speed_factors(o["vs_profile"]), name,
            o["page_bytes"], o["num_pages"],
            "concurrent" if args.decode_workers else decode_mode(args, name, gen))
    meta = {
        "command": "demo", "model": args.model, "workload": args.workload,
        "device": args.profile, "load": args.load, "arrival": args.arrival,
        "requests": len(trace), "seed": args.seed, "divisor": args.divisor,
        "decode_workers": args.decode_workers, "mode": args.mode, "exact_load": True,
        "decode": {n: decode_mode(args, n, gen) for n in names},
        "decode_tile": decode_tile(args, gen),
        "shapes": sorted({f"{r.width}x{r.height}" for r in trace}),
        "total_wall_s": time.perf_counter() - started,
    }
    start_cost = CostModel.load(args.profile)
    meta.update(trace_limits(trace, start_cost))
    meta["tail_criterion"] = tail_criterion(trace, start_cost, results)
    rows = [dict(meta, policy=name, **{k: v for k, v in res.items() if k != "latencies_s"})
            for name, res in results.items()]
    print(comparison_table(results, meta))
    print("the run vs its start-up profile (in-run seconds / the profile's, summed per kind; "
          "the load the run measured beside the requested one):")
    for name, res in results.items():
        print("\n".join(report(name, res["vs_profile"], args.load, res["measured_load"],
                                trace_load=meta["trace_load"])))
    print(f"largest / smallest standalone time: {meta['standalone_ratio']:.1f}x; "
          f"offline bound for this trace: any policy <= {100 * meta['bound_attainment']:.1f}%"
          f"; clairvoyant EDF reaches {100 * meta['clairvoyant_attainment']:.1f}% "
          "(on the start-up profile's times)")
    print("the references at the speed each run measured (same arrivals and deadlines; the "
          "device's times x the run's own per kind; JSON: at_run_speed):")
    for name, res in results.items():
        print("\n".join(describe(name, dict(meta, **res), res["at_run_speed"], res)))
    if meta["tail_criterion"] is not None:
        from ditmem.tools.tail_verdict import describe_verdict

        print(describe_verdict(meta["tail_criterion"]))
    if args.plot:
        from ditmem.tools.plots import plot_comparison

        title = (f"{args.workload} (/{args.divisor}) on {args.model}, rho={args.load}, "
                 f"{len(trace)} requests, seed {args.seed}")
        print(f"plot: {plot_comparison(results, args.plot, title)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
        print(f"json: {args.json}")
    if args.decisions:
        with open(args.decisions, "w") as f:
            json.dump({n: outcomes[n]["decisions"] for n in names}, f)
        print(f"decisions: {args.decisions}")
    return 0
