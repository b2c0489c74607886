"""Real run of the engine on CPU (tiny Wan, 8 blocks): wait of high-priority arrivals behind
long video steps, ``preemption="step"`` vs ``"block"``, and the throughput cost of chunking.

Three long videos (priority 2) start at once; urgent small requests (priority 0, SLO =
their standalone time + half a video step) arrive at seeded random times while they run.
Decode runs on a worker thread (``decode_workers=1``) so the step loop is what the urgent
requests wait for. The policy is ``slo`` on a cost model measured here (step, encode and
decode times, per-chunk overhead; 8 blocks; boundary bytes), ``chunk_budget`` 3 %: it picks
the chunk size (``--k`` fixes it) and parks a video step only when an urgent arrival's slack
needs it. Wait = arrival → first stage. Throughput: the videos alone, step vs block mode,
makespan ratio. Repeats alternate the modes; medians reported.

    python benchmarks/serving/block_preemption.py [--quick] [--k K] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import threading
import time

import torch

from ditmem.engine.loop import Engine
from ditmem.memory import HostPool, OffloadEngine, PagePool
from ditmem.models.common.chunked import ChunkRunner
from ditmem.models.common.request import GenerationRequest
from ditmem.models.wan.generate import WanGenerator
from ditmem.models.wan.tiny import build_pipeline, build_tiny_transformer
from ditmem.scheduler import CostModel, make_policy
from ditmem.tools.profile import median_time

BLOCKS, PAGE = 8, 1 << 16
LONG = dict(width=256, height=256, num_frames=33, num_inference_steps=4, guidance_scale=5.0)
URGENT = dict(width=32, height=32, num_frames=1, num_inference_steps=4, guidance_scale=1.0)


def generator() -> WanGenerator:
    pipe = build_pipeline()
    pipe.transformer = build_tiny_transformer(2, num_layers=BLOCKS)
    return WanGenerator(pipe, name="tiny-wan-8L", max_sequence_length=64)


def measured_profile(gen) -> dict:
    """Step seconds of both shapes and the cost of one preemption point, measured now."""
    pool = PagePool(2048, PAGE)
    points, step_of = [], {}
    small = GenerationRequest("p", seed=0, **URGENT)
    t0 = time.perf_counter()
    s = gen.encode(small, pool)
    encode_s = time.perf_counter() - t0
    while not gen.is_done(s):
        gen.step([s])
    t0 = time.perf_counter()
    gen.decode(s)
    decode_mp = (time.perf_counter() - t0) / (URGENT["width"] * URGENT["height"] / 1e6)
    gen.release(s)
    for name, shape in (("long", LONG), ("urgent", URGENT)):
        r = GenerationRequest("p", seed=0, **{**shape, "num_inference_steps": 20})
        s = gen.encode(r, pool)
        gen.step([s])  # warm-up
        step_of[name] = median_time(lambda s=s: gen.step([s]), 3)
        tokens = gen.shapes.tokens(r)
        points.append({"tokens": tokens, "batch": 1, "seconds": step_of[name]})
        if name == "long":  # the engine's path: one-block chunks of an open step
            runner = ChunkRunner(gen, OffloadEngine(pool, HostPool(2048, PAGE)))

            def chunked(s=s, runner=runner):
                for _ in range(BLOCKS):
                    if not runner.run_chunk([s], 1):
                        raise RuntimeError("no room for the boundary activations")
            overhead = max(0.0, (median_time(chunked, 3) - step_of[name]) / (BLOCKS - 1))
        gen.release(s)
    dim = gen.shapes.inner_dim
    src = "measured by benchmarks/serving/block_preemption.py"
    v = lambda x: {"value": x, "source": src}  # noqa: E731
    return {
        "format": 1, "name": "cpu-tiny-wan-8L", "device_bytes": v(1e10), "host_bytes": v(4e10),
        "host_link_bytes_per_s": v(5e9), "chunk_overhead_s": v(overhead),
        "models": {"wan2.2-a14b": {
            "weights_bytes": v(0), "workspace_bytes": v(0), "state_bytes_per_token": v(0),
            "state_bytes_per_request": v(PAGE), "encode_s": v(encode_s),
            "decode_s_per_megapixel": v(decode_mp), "max_batch": v(1), "blocks": v(BLOCKS),
            "activation_bytes_per_token": v(2 * dim * 4),
            "step": {"kind": "table", "points": v(points)},
        }},
    }


def run(gen, profile, mode, urgent_at, slo_ms, k=None) -> dict:
    cost = CostModel.from_dict(profile)
    policy = make_policy("slo", cost, chunk_budget=0.03)
    policy.fixed_chunk = k
    engine = Engine(gen, policy, cost, PagePool(2048, PAGE), HostPool(4096, PAGE),
                    model="wan2.2-a14b", preemption=mode, offload_mode="thread",
                    decode_workers=1).start()
    t0 = time.perf_counter()
    longs = [engine.submit(GenerationRequest(f"long {i}", seed=i, request_id=f"L{i}", **LONG),
                           priority=2) for i in range(3)]
    urgent = []

    def arrivals():
        for i, at in enumerate(urgent_at):
            time.sleep(max(0.0, t0 + at - time.perf_counter()))
            r = GenerationRequest(f"now {i}", seed=100 + i, request_id=f"U{i}", **URGENT)
            urgent.append(engine.submit(r, priority=0, slo_ms=slo_ms))

    feeder = threading.Thread(target=arrivals)
    feeder.start()
    feeder.join()
    results = [t.future.result(600) for t in longs + urgent]
    makespan = time.perf_counter() - t0
    engine.drain(60)
    engine.stop()
    waits = [r.timing.queued_s for r in results[len(longs):]]
    parks = engine.executor.blocks.parks if engine.executor.blocks is not None else 0
    return {"mode": mode, "makespan_s": makespan, "waits_s": waits, "parks": parks,
            "urgent_met": sum(r.slo_met for r in results[len(longs):]),
            "outputs": [r.output for r in results]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat, 4 urgent arrivals")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=int, help="blocks per chunk (default: the policy's choice)")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = generator()
    profile = measured_profile(gen)
    step_s = profile["models"]["wan2.2-a14b"]["step"]["points"]["value"][0]["seconds"]
    rng = random.Random(0)
    n = 4 if args.quick else 10
    horizon = 3 * LONG["num_inference_steps"] * step_s
    urgent_at = sorted(rng.uniform(0.1 * horizon, 0.8 * horizon) for _ in range(n))
    urgent_alone = CostModel.from_dict(profile).standalone_time(_sched_urgent())
    # an urgent request can afford half a video step of waiting, not a whole one
    slo_ms = 1000 * (urgent_alone + 0.5 * step_s)
    repeats = 1 if args.quick else args.repeats
    rows = {"step": [], "block": []}
    for rep in range(repeats):
        for mode in (("step", "block") if rep % 2 == 0 else ("block", "step")):
            rows[mode].append(run(gen, profile, mode, urgent_at, slo_ms, args.k))
            gc.collect()
        for mode in ("step", "block"):  # throughput: the videos alone
            alone = run(gen, profile, mode, [], slo_ms, args.k)
            rows[mode][-1]["videos_only_s"] = alone["makespan_s"]
            gc.collect()
    same = all(all((a == b).all() for a, b in zip(s["outputs"], b_["outputs"], strict=True))
               for s, b_ in zip(rows["step"], rows["block"], strict=True))
    summary = {
        "model": gen.name, "blocks": BLOCKS, "long": LONG, "urgent": URGENT,
        "long_step_s": step_s, "chunk_overhead_s": profile["chunk_overhead_s"]["value"],
        "urgent_slo_ms": slo_ms, "urgent_arrivals": n, "repeats": repeats,
        "chunk_blocks": args.k or make_policy(
            "slo", CostModel.from_dict(profile), chunk_budget=0.03).chunk_blocks([_sched_long()]),
        "chunk_fixed": args.k is not None,
        "outputs_identical": same,
    }
    for mode, rs in rows.items():
        waits = [w for r in rs for w in r["waits_s"]]
        summary[mode] = {
            "wait_max_s": statistics.median(max(r["waits_s"]) for r in rs),
            "wait_p50_s": statistics.median(waits),
            "urgent_met": sum(r["urgent_met"] for r in rs) / (n * len(rs)),
            "parks": statistics.median(r["parks"] for r in rs),
            "videos_only_s": statistics.median(r["videos_only_s"] for r in rs),
            "waits_by_repeat_s": [r["waits_s"] for r in rs],  # urgent arrivals, in order
        }
    ratio = statistics.median(b["videos_only_s"] / s["videos_only_s"]
                              for s, b in zip(rows["step"], rows["block"], strict=True))
    summary["throughput_overhead"] = ratio - 1.0
    print(f"tiny-wan-8L, long {LONG['width']}x{LONG['height']}x{LONG['num_frames']} step "
          f"{1e3 * step_s:.1f} ms, chunk {summary['chunk_blocks']} blocks, point "
          f"{1e3 * summary['chunk_overhead_s']:.2f} ms, urgent SLO {slo_ms:.0f} ms")
    print(f"{'mode':<6} {'max wait ms':>11} {'P50 wait ms':>11} {'urgent met %':>12} "
          f"{'parks':>6} {'videos alone s':>14}")
    for mode in ("step", "block"):
        m = summary[mode]
        print(f"{mode:<6} {1e3 * m['wait_max_s']:11.1f} {1e3 * m['wait_p50_s']:11.1f} "
              f"{100 * m['urgent_met']:12.1f} {m['parks']:6.0f} {m['videos_only_s']:14.3f}")
    wait_ratio = summary["block"]["wait_max_s"] / summary["step"]["wait_max_s"]
    summary["max_wait_ratio"] = wait_ratio
    print(f"max wait block/step: {wait_ratio:.3f}; throughput overhead (videos alone): "
          f"{100 * summary['throughput_overhead']:+.2f} %; outputs identical: {same}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)
        print(f"json: {args.json}")
    return 0


def _sched_urgent():
    from ditmem.scheduler import Request

    return Request("U", 0.0, "wan2.2-a14b", URGENT["width"], URGENT["height"], 1,
                   URGENT["num_inference_steps"], priority=0)


def _sched_long():
    from ditmem.scheduler import Request

    return Request("L", 0.0, "wan2.2-a14b", LONG["width"], LONG["height"], LONG["num_frames"],
                   LONG["num_inference_steps"])


if __name__ == "__main__":
    raise SystemExit(main())
