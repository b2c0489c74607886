"""The HTTP bench's trace replayed in the simulator: fifo and slo (earliest deadline) side
by side, on the measured profile with timing noise on. (slo's FIFO-first order, a third row
until session 17, was removed with its option: docs/results/scheduler.md, "Session 17".)

    python benchmarks/scheduler/replay_bench.py [--bench JSON] [--seeds 3] [--json OUT]
        [--noise-seeds N] [--setting LABEL=KEY:VALUE,KEY:VALUE ...]
        [--demo RUN.json ... [--demo-seeds N]]
        [--late-share S ...]

``--bench`` (default ``benchmarks/serving/results/bench_omni_random_s5.json``, written by
``benchmarks/serving/bench_serving.py --mix omni-random --json``) carries both runs'
per-request rows (arrival, sides, steps, the client's SLO) and the profile the server
measured at start. Row "bench trace": the bench's own arrivals and shapes, deadlines as the
server sets them (``--slo-scale``, default 3, × the profile's standalone time, as ``ditmem
serve --slo-scale``; repeatable: every trace at each scale, labelled ``xS``), attainment
both against those and against the client's SLOs (its warm-up rule). Rows "seed k": the
same shapes with fresh Poisson arrivals at the bench's load (``--load``, default 0.8);
their client SLOs are the bench's for the same shape (the warm-up rule depends on the shape alone).
``--noise-seeds N`` replays each of those traces with noise seeds 0..N-1 (a row each).
Each policy decodes as the server runs it (``server_decode``: fifo inline, slo tile by tile
when the profile has tiles; before session 18 every row decoded inline).
Columns: attainment (%), P50/P95/P99/max latency (s) and P95/P99/max over fifo's.

``--demo RUN.json`` (repeatable; a ``ditmem demo --json`` file with its
``RUN_profile.json`` beside it, e.g. ``benchmarks/serving/results/demo_s5_run1.json``):
the demo's trace rebuilt from its settings (workload, divisor, requests, seed, load) on the
profile that run measured, each setting simulated with the run's decode mode per policy
(the demo's own prediction also fixes the engine's page pool; this replay keeps the
profile's), beside what the run measured; ``--demo-seeds N`` adds N fresh traces of the
same demo (its seed + 1 .. + N) on the same profile.

``--late-share S`` (repeatable) repeats every slo row of the demos (the runs that decode tile
by tile) with ``simulate(late_share=S)`` in place of the default (``decode_lane.LATE_SHARE``,
0.1; 0: the rule before, where a late decode waits for an idle device), labelled ``... ls=S``.

``--bound`` prints, per trace, what no schedule can beat: the attainment bound
(``bound.min_misses``), the bound with the tail target (every flow ≤ fifo's maximum and at
most ``allowed_above(N, 99)`` above fifo's P99, both from a noiseless fifo run:
``tail_bound.min_misses_tail``) charged with the profile's best packing and with batch-1
times (``work="standalone"``: it binds every schedule that does not pack), and the
clairvoyant batch-1 reference (``bound.clairvoyant_misses``). ``--co-present`` adds the
co-present packing credit (``tail_bound.co_present_works``: a request packed only with the
requests that can be present beside it; the larger miss count of its two splits) for the
P99-and-max target (``bound_tail_co_present``) and, for the P99 alone (no maximum), the
trace-wide packing rules, co-present and batch-1 (``bound_p99_packing``,
``bound_p99_co_present``, ``bound_p99_batch1``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math

from ditmem.scheduler import CostModel
from ditmem.scheduler.bound import clairvoyant_misses, min_misses
from ditmem.scheduler.decode_lane import LATE_SHARE
from ditmem.scheduler.metrics import percentile, summarize
from ditmem.scheduler.noise import DEFAULT_SIGMA, TimingNoise
from ditmem.scheduler.policies import make_policy
from ditmem.scheduler.request import Request
from ditmem.scheduler.simulator import simulate
from ditmem.scheduler.tail_bound import allowed_above, min_misses_tail
from ditmem.scheduler.workloads import with_load

DEFAULT_BENCH = "benchmarks/serving/results/bench_omni_random_s5.json"
SETTINGS = [("fifo", "fifo", {}), ("slo", "slo", {})]


def bench_trace(bench: dict) -> tuple[list[Request], dict[str, float]]:
    """The bench's requests (fifo run's rows: arrivals and shapes, the same for every run) and
    each one's client-side SLO (s)."""
    rows = next(iter(bench["runs"].values()))["per_request"]
    reqs = [Request(id=r["id"], arrival=r["arrival_s"], width=r["width"], height=r["height"],
                    frames=r["frames"], steps=r["steps"], priority=r["priority"])
            for r in rows]
    return reqs, {r["id"]: r["slo_s"] for r in rows}


def shape(r: Request) -> tuple[int, int, int, int]:
    return r.width, r.height, r.frames, r.steps


def client_by_shape(reqs: list[Request], client: dict[str, float]) -> dict[tuple, float]:
    """The client's SLO (s) per shape: its warm-up rule (3 x a warm-up unit x pixels x steps)
    depends on the shape alone, so a fresh trace of the same shapes has the same SLOs."""
    out: dict[tuple, float] = {}
    for r in reqs:
        if abs(out.setdefault(shape(r), client[r.id]) - client[r.id]) > 1e-9 * client[r.id]:
            raise ValueError(f"bench: two client SLOs for shape {shape(r)}")
    return out


def parse_setting(text: str) -> tuple[str, str, dict]:
    """``LABEL=KEY:VALUE,...`` -> ("LABEL", "slo", options); values as JSON where they parse."""
    label, _, opts = text.partition("=")
    options = {}
    for item in filter(None, opts.split(",")):
        key, _, value = item.partition(":")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return label, "slo", options


def saved_demo(path: str) -> tuple[dict[str, dict], CostModel]:
    """A saved ``ditmem demo --json`` file's rows by policy, and the cost model of the
    profile saved beside it (``RUN_profile.json``)."""
    with open(path) as fh:
        runs = {r["policy"]: r for r in json.load(fh)}
    return runs, CostModel.load(path.removesuffix(".json") + "_profile.json")


def demo_trace(run: dict, cost: CostModel) -> list[Request]:
    """The requests ``ditmem demo`` built for ``run`` (its JSON row): the workload at the
    run's load, sides divided by its divisor, arrivals and deadlines from ``cost``
    (``demo.build_trace``; scaled to the exact load where the run was)."""
    from ditmem.tools.demo import build_trace

    args = argparse.Namespace(**{k: run[k] for k in ("workload", "load", "requests", "seed",
                                                      "arrival", "divisor")})
    return build_trace(args, cost, run.get("exact_load", False))


def bounds(name: str, reqs: list[Request], cost: CostModel, co_present: bool = False) -> dict:
    """The trace's bounds (module docstring, ``--bound``; ``co_present``: ``--co-present``'s
    too), printed and returned (fractions)."""
    fifo = simulate([dataclasses.replace(r) for r in reqs], make_policy("fifo", cost.fresh()))
    lat = [rec.latency for rec in fifo.records]
    top, p99, n = max(lat), percentile(lat, 99), len(reqs)
    k = allowed_above(n, 99.0)
    out = {
        "trace": name, "fifo_p99_s": p99, "fifo_max_s": top,
        "bound": 1 - min_misses(reqs, cost) / n,
        "bound_tail_packing": 1 - min_misses_tail([reqs], cost, top, p99, k) / n,
        "bound_tail_batch1": 1 - min_misses_tail([reqs], cost, top, p99, k,
                                                 work="standalone") / n,
        "clairvoyant": 1 - clairvoyant_misses(reqs, cost) / n,
        "standalone_work_s": sum(cost.standalone_time(r) for r in reqs),
    }
    print(f"{name}: bound {100 * out['bound']:.1f} %; with P99 <= {p99:.2f} s and max <= "
          f"{top:.2f} s (fifo's, noiseless): {100 * out['bound_tail_packing']:.1f} % with "
          f"packing, {100 * out['bound_tail_batch1']:.1f} % batch-1; clairvoyant batch-1 "
          f"{100 * out['clairvoyant']:.1f} %; batch-1 work {out['standalone_work_s']:.1f} s "
          f"(each row's device busy time: busy_s in --json)")
    if co_present:
        def worst(max_flow: float, works: tuple[str, ...]) -> float:
            return 1 - max(min_misses_tail([reqs], cost, max_flow, p99, k, work=w)
                           for w in works) / n
        co = ("co-present", "co-present-proportional")
        out["bound_tail_co_present"] = worst(top, co)
        out["bound_p99_packing"] = worst(math.inf, ("profile", "proportional"))
        out["bound_p99_co_present"] = worst(math.inf, co)
        out["bound_p99_batch1"] = worst(math.inf, ("standalone",))
        print(f"{name}: co-present packing: {100 * out['bound_tail_co_present']:.1f} % with "
              f"P99 and max <= fifo's; P99 alone: {100 * out['bound_p99_packing']:.1f} % "
              f"packing, {100 * out['bound_p99_co_present']:.1f} % co-present, "
              f"{100 * out['bound_p99_batch1']:.1f} % batch-1")
    return out


def replay_demo(path: str, settings, sigma: float, seed_offset: int = 0,
                shares: tuple[float, ...] = (), bound: list | None = None,
                co_present: bool = False) -> list[dict]:
    """Every setting on the trace of the demo run in ``path`` (module docstring); with
    ``seed_offset`` k > 0, a fresh trace of the same demo (its seed + k)."""
    runs, cost = saved_demo(path)
    first = next(iter(runs.values()))
    reqs = demo_trace(dict(first, seed=first["seed"] + seed_offset), cost)
    if seed_offset == 0:
        print(f"demo {path}: {len(reqs)} requests, measured: " + "; ".join(
            f"{p} {100 * r['slo_attainment']:.1f} % P95 {r['p95_s']:.2f} P99 {r['p99_s']:.2f} "
            f"max {r['max_s']:.2f} (its sim {100 * r['sim_slo_attainment']:.1f} % "
            f"P95 {r['sim_p95_s']:.2f})" for p, r in runs.items()))
    trace = path if seed_offset == 0 else f"{path.removesuffix('.json')}+{seed_offset}.json"
    if bound is not None:
        bound.append(bounds(trace.rsplit("/", 1)[-1].removesuffix(".json"), reqs, cost,
                            co_present))
    runs_of = [(label, policy, options, None) for label, policy, options in settings]
    runs_of += [(f"{label} ls={share:g}", policy, options, share) for share in shares
                for label, policy, options in settings if policy == "slo"]
    rows = []
    for label, policy, options, share in runs_of:
        decode = first["decode"].get(policy, "inline")
        pol = make_policy(policy, cost.fresh(), **options)
        result = simulate([dataclasses.replace(r) for r in reqs], pol, decode=decode,
                          late_share=LATE_SHARE if share is None else share,
                          noise=TimingNoise(sigma=sigma, seed=0))
        out = summarize(result.records)
        out.update(trace=trace, setting=label, options=options, late_share=share,
                   busy_s=result.busy_s)
        rows.append(out)
    return rows


def server_decode(policy: str, cost: CostModel) -> str:
    """The decode mode ``ditmem serve --decode auto`` (its default) runs ``policy`` with
    (``engine.factory.resolve_decode``): fifo inline, the others tile by tile when the
    profile has a tile geometry (``decode_tile_px``; ``ditmem serve`` measures one for the
    models that tile), else inline."""
    tiles = all("decode_tile_px" in sec for sec in cost.profile["models"].values())
    return "tiled" if tiles and policy != "fifo" else "inline"


def run(reqs: list[Request], cost: CostModel, policy: str, options: dict, seed: int,
        sigma: float, client_slo: dict[str, float] | None) -> dict:
    pol = make_policy(policy, cost.fresh(), **options)
    result = simulate(reqs, pol, decode=server_decode(policy, cost),
                      noise=TimingNoise(sigma=sigma, seed=seed))
    out = summarize(result.records)
    out["busy_s"] = result.busy_s
    if client_slo is not None:
        met = [rec.latency <= client_slo[rec.request.id] for rec in result.records]
        out["client_attainment"] = sum(met) / len(met)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=DEFAULT_BENCH)
    ap.add_argument("--seeds", type=int, default=3,
                    help="fresh-arrival traces (seeds 1..N) besides the bench's (seed 0)")
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--noise", type=float, default=DEFAULT_SIGMA)
    ap.add_argument("--slo-scale", type=float, action="append", default=None,
                    help="the server's deadlines: scale x standalone time (ditmem serve "
                         "--slo-scale; default 3); repeatable: every trace at each scale")
    ap.add_argument("--noise-seeds", type=int, default=1,
                    help="replay each bench trace with noise seeds 0..N-1 (default 1: seed 0)")
    ap.add_argument("--setting", action="append", default=[],
                    help="extra slo row LABEL=KEY:VALUE,... (repeatable)")
    ap.add_argument("--demo", action="append", default=[],
                    help="a ditmem demo --json file to replay as well (repeatable)")
    ap.add_argument("--demo-seeds", type=int, default=0,
                    help="fresh traces of each --demo (its seed + 1..N) on its profile")
    ap.add_argument("--late-share", type=float, action="append", default=[],
                    help="repeat the demos' slo rows with simulate(late_share=S) (repeatable)")
    ap.add_argument("--bound", action="store_true",
                    help="print each trace's bounds (with the tail target; module docstring)")
    ap.add_argument("--co-present", action="store_true",
                    help="with --bound: the co-present packing bounds too (module docstring)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    args.slo_scale = args.slo_scale or [3.0]
    logging.basicConfig(level=logging.WARNING)
    with open(args.bench) as fh:
        bench = json.load(fh)
    cost = CostModel.from_dict(bench["profile_data"])
    base, client = bench_trace(bench)
    by_shape = client_by_shape(base, client)
    traces = []
    for scale in args.slo_scale:
        tag = "" if args.slo_scale == [3.0] else f" x{scale:g}"
        traces.append((f"bench trace{tag}", scale, [
            cost.assign_deadline(r.resubmitted(r.arrival), scale) for r in base], client))
        for seed in range(1, args.seeds + 1):  # seed 0 is the bench's own arrivals
            fresh = with_load(base, cost, args.load, seed=seed, slo_scale=scale)
            traces.append((f"seed {seed}{tag}", scale, fresh,
                           {r.id: by_shape[shape(r)] for r in fresh}))
    settings = SETTINGS + [parse_setting(s) for s in args.setting]
    rows: list[dict] = []
    found_bounds: list | None = [] if args.bound else None
    print(f"{len(base)} requests ({args.bench}), profile {cost.name!r}, noise {args.noise:g}")
    print(f"{'trace':<18} {'policy':<26} {'att %':>6} {'client':>6} {'P50':>6} {'P95':>6} "
          f"{'P99':>6} {'max':>6} {'P95/f':>6} {'P99/f':>6} {'max/f':>6}")
    for name, scale, reqs, slo in traces:
        if found_bounds is not None:
            found_bounds.append(bounds(name, reqs, cost, args.co_present))
        for j in range(args.noise_seeds):
            found = [run(reqs, cost, policy, options, j, args.noise, slo) | dict(
                trace=name, slo_scale=scale, noise_seed=j, setting=label, options=options)
                for label, policy, options in settings]
            show(found, True)
            rows += found
    for scale in args.slo_scale:
        summarize_settings([r for r in rows if r.get("slo_scale") == scale], scale)
    for path in args.demo:
        for k in range(args.demo_seeds + 1):
            found = replay_demo(path, settings, args.noise, k, tuple(args.late_share),
                                found_bounds, args.co_present)
            show(found, False)
            rows += found
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"bench": args.bench, "rows": rows, "bounds": found_bounds}, fh, indent=2)
        print(f"json: {args.json}")


def summarize_settings(rows: list[dict], scale: float) -> None:
    """Print, per setting, over the bench traces' rows (each (trace, noise seed) replayed
    with fifo first): mean attainment (server's deadlines, client's SLOs; %), the worst
    client attainment, median P95/P99 over fifo's, and on how many runs P95 and P99 are
    both at most fifo's."""
    runs: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        runs.setdefault((r["trace"], r["noise_seed"]), {})[r["setting"]] = r
    if not runs:
        return
    print(f"\nserver deadlines {scale:g} x standalone, over {len(runs)} runs:\n"
          f"{'setting':<26} {'att %':>6} {'client':>6} "
          f"{'worst':>6} {'P95/f':>6} {'P99/f':>6} {'both<=1':>8}")
    for label in next(iter(runs.values())):
        got = [(by[label], by["fifo"]) for by in runs.values()]
        p95 = sorted(r["p95_s"] / f["p95_s"] for r, f in got)
        p99 = sorted(r["p99_s"] / f["p99_s"] for r, f in got)
        both = sum(r["p95_s"] <= f["p95_s"] and r["p99_s"] <= f["p99_s"] for r, f in got)
        att = sum(r["slo_attainment"] for r, _ in got) / len(got)
        cli = [r["client_attainment"] for r, _ in got]
        print(f"{label:<26} {100 * att:6.1f} "
              f"{100 * sum(cli) / len(cli):6.1f} {100 * min(cli):6.1f} "
              f"{percentile(p95, 50):6.2f} {percentile(p99, 50):6.2f} "
              f"{both:>4}/{len(got)}")


def show(rows: list[dict], client: bool) -> None:
    """Print ``rows`` (one trace's settings, fifo first) with ratios to the first."""
    fifo = rows[0]
    for r in rows:
        name = r["trace"].rsplit("/", 1)[-1].removesuffix(".json")
        if "noise_seed" in r:
            name = f"{name} n{r['noise_seed']}"
        client_att = f"{100 * r['client_attainment']:6.1f}" if client else f"{'':>6}"
        print(f"{name:<18} {r['setting']:<26} {100 * r['slo_attainment']:6.1f} {client_att} "
              f"{r['p50_s']:6.2f} {r['p95_s']:6.2f} {r['p99_s']:6.2f} {r['max_s']:6.2f} "
              f"{r['p95_s'] / fifo['p95_s']:6.2f} {r['p99_s'] / fifo['p99_s']:6.2f} "
              f"{r['max_s'] / fifo['max_s']:6.2f}")


if __name__ == "__main__":
    main()
