"""Real run on CPU (tiny Wan): wait of an urgent arrival behind a long step, and the throughput
cost of running steps as chunks of blocks (``ditmem.models.common.chunked.ChunkRunner``).

Worst case for an urgent request: it arrives as a long request's step (step preemption) or
chunk (block preemption) begins. It can start once that step ends — or once the chunk ends
and the long request is parked (its boundary offload launched on a worker thread). Measured
side by side, median of repeats. Throughput: the long request's whole generation run as
whole steps (baseline), as chunks of k blocks, and as chunks with a park + restore at every
chunk boundary (the worst case: preempted at every point). Chunks keep the step open
between them (no page traffic without a park); "closed" writes the boundary to pages and
reopens the step from them at every chunk — what every chunk cost before open steps, the
baseline of that change, measured in the same rounds. Final latents are checked
bit-identical across all modes.

    python benchmarks/models/chunked_wait.py [--quick] [--blocks 8] [--k 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import ditmem.models as dm
from ditmem.memory import HostPool, OffloadEngine, PagePool
from ditmem.models.common.chunked import ChunkRunner
from ditmem.models.wan.generate import WanGenerator
from ditmem.models.wan.tiny import build_pipeline, build_tiny_transformer

PAGE = 1 << 16


def tiny_wan(blocks: int) -> WanGenerator:
    """Embedded tiny Wan; ``blocks`` != 2 swaps in a deeper tiny transformer (same config)."""
    if blocks == 2:
        return dm.load("tiny-wan", max_sequence_length=64)
    pipe = build_pipeline()
    pipe.transformer = build_tiny_transformer(2, num_layers=blocks)
    return WanGenerator(pipe, name=f"tiny-wan-{blocks}L", max_sequence_length=64)


def _step_chunks(runner, gen, state, k, between=None):
    """One whole step of ``state`` as chunks of ``k``; between chunks: nothing (the step
    stays open), ``"close"`` (boundary written to pages and the step reopened from them at
    the next chunk: what every chunk cost before open steps) or ``"park"`` (park + restore)."""
    while True:
        runner.run_chunk([state], k)
        if gen.block(state) == 0:
            return
        if between == "close":
            runner.flush()
        elif between == "park":
            parked = runner.park([state])
            runner.settle(parked, wait=True)
            runner.resume(parked)


def measure(blocks: int, k: int, size: int, frames: int, steps: int, repeats: int) -> dict:
    torch.set_num_threads(1)
    gen = tiny_wan(blocks)
    k = min(k, blocks - 1)  # a chunk that ends the step leaves nothing to park
    pool, host = PagePool(8192, PAGE), HostPool(8192, PAGE)
    engine = OffloadEngine(pool, host, mode="thread")
    runner = ChunkRunner(gen, engine)
    long = dm.GenerationRequest("a long video", width=size, height=size, num_frames=frames,
                                num_inference_steps=steps, guidance_scale=5.0, seed=1)
    urgent = dm.GenerationRequest("now", width=32, height=32, num_frames=1,
                                  num_inference_steps=steps, guidance_scale=1.0, seed=2)
    waits_step, waits_block, t_whole, t_chunk, t_closed, t_park = [], [], [], [], [], []
    finals = {}
    for rep in range(repeats):
        # --- wait behind a step vs behind a chunk (arrival as it begins)
        s, u = gen.encode(long, pool), gen.encode(urgent, pool)
        t0 = time.perf_counter()
        gen.step([s])
        waits_step.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        runner.run_chunk([s], k)
        parked = runner.park([s])
        waits_block.append(time.perf_counter() - t0)
        gen.step([u])
        runner.resume(parked)
        _step_chunks(runner, gen, s, k)
        gen.release(s)
        gen.release(u)
        # --- throughput: whole steps / chunks (open step) / chunks closed at every point /
        # chunks parked at every point (rotated order)
        modes = [("whole", t_whole), ("chunk", t_chunk), ("close", t_closed), ("park", t_park)]
        for name, out in modes[rep % 4:] + modes[: rep % 4]:
            s = gen.encode(long, pool)
            t0 = time.perf_counter()
            while not gen.is_done(s):
                if name == "whole":
                    gen.step([s])
                else:
                    _step_chunks(runner, gen, s, k, None if name == "chunk" else name)
            out.append(time.perf_counter() - t0)
            finals[name] = gen.latents(s)
            gen.release(s)
    engine.close()
    identical = all(torch.equal(finals["whole"], finals[m]) for m in ("chunk", "close", "park"))

    def overhead(times):
        return statistics.median(c / w for c, w in zip(times, t_whole, strict=True)) - 1.0

    return {
        "model": gen.name,
        "blocks": blocks,
        "k": k,
        "shape": f"{size}x{size}x{frames}",
        "steps": steps,
        "repeats": repeats,
        "wait_step_s": statistics.median(waits_step),
        "wait_block_s": statistics.median(waits_block),
        "wait_ratio": statistics.median(
            b / a for a, b in zip(waits_step, waits_block, strict=True)
        ),
        "gen_whole_s": statistics.median(t_whole),
        "chunk_overhead": overhead(t_chunk),
        "closed_chunk_overhead": overhead(t_closed),
        "park_every_chunk_overhead": overhead(t_park),
        "bit_identical": identical,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and steps")
    ap.add_argument("--blocks", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--k", type=int, default=1, help="blocks per chunk")
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--frames", type=int, default=33)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args()
    repeats, steps = (3, 2) if args.quick else (9, 4)
    rows = [measure(b, args.k, args.size, args.frames, steps, repeats) for b in args.blocks]
    print(f"{'model':<14} {'k':>2} {'shape':<12} {'wait step ms':>12} {'wait block ms':>13} "
          f"{'ratio':>6} {'chunk ovh %':>11} {'closed ovh %':>12} {'park-all ovh %':>14} "
          f"{'identical':>9}")
    for r in rows:
        print(f"{r['model']:<14} {r['k']:>2} {r['shape']:<12} {1e3 * r['wait_step_s']:12.2f} "
              f"{1e3 * r['wait_block_s']:13.2f} {r['wait_ratio']:6.3f} "
              f"{100 * r['chunk_overhead']:11.2f} {100 * r['closed_chunk_overhead']:12.2f} "
              f"{100 * r['park_every_chunk_overhead']:14.2f} "
              f"{str(r['bit_identical']):>9}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
        print(f"json: {args.json}")
    return 0 if all(r["bit_identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
