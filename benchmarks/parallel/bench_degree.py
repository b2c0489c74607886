"""One request's denoising step at sequence-parallel degree 2 (and 4 where the node has the
devices) vs degree 1, on the node engine's real device workers, side by side.

    .venv/bin/python benchmarks/parallel/bench_degree.py [--model tiny-qwen-image]
        [--devices 2] [--sides 256,512,1024] [--repeats 7] [--frames 1] [--json PATH]

On CPU a device is a worker process pinned to one core with one thread, so degree 1 uses
one core and degree 2 two. Rounds are interleaved (two steps per degree per round, median of
per-round ratios, more rounds while they spread; see ditmem.parallel.speedup). The baseline
is degree 1 in the same run. Columns: speed-up on wall, main-thread CPU and all-thread
(process) CPU time; spread of the CPU ratios; work = the ranks' summed CPU time / degree
1's; the plausibility check the demo applies.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-qwen-image")
    ap.add_argument("--devices", type=int, default=2, help="worker processes (<= cores)")
    ap.add_argument("--sides", default="256,512,1024", help="square image sides, px")
    ap.add_argument("--repeats", type=int, default=7, help="timed rounds per side")
    ap.add_argument("--frames", type=int, default=1, help="frames per request (video models)")
    ap.add_argument("--pool-mb", type=float, default=256.0, help="device pool per worker")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if args.devices > (os.cpu_count() or 1):
        ap.error(f"--devices {args.devices} exceeds the {os.cpu_count()} cores")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from ditmem.engine.factory import scheduler_model
    from ditmem.parallel.node import NodeEngine
    from ditmem.parallel.speedup import check_speedups, measure_speedups
    from ditmem.scheduler.models import tokens_for

    sides = [int(s) for s in args.sides.split(",")]
    page = 1 << 16
    pages = max(64, int(args.pool_mb * 2**20) // page)
    t0 = time.perf_counter()
    with NodeEngine(args.model, args.devices, pool_pages=pages, page_bytes=page,
                    host_pages=64) as node:
        key = scheduler_model(args.model)
        rows = measure_speedups(node, sides, args.repeats, frames=args.frames,
                                tokens_for=lambda side: tokens_for(key, side, side, args.frames),
                                progress=logging.info)
    machine = f"{platform.node()} ({os.cpu_count()} cores, {platform.processor() or 'cpu'})"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"\n{args.model} ({args.frames} frames), {args.devices} devices, {args.repeats} "
          f"rounds, {machine}, {when}, "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"{'side':>6} {'tokens':>7} {'degree':>6} {'step ms':>9} {'speedup':>8} "
          f"{'cpu ms':>8} {'cpu speedup':>11} {'spread':>7} {'proc speedup':>12} "
          f"{'work':>5} {'rounds':>6} {'control ms':>10}")
    for r in rows:
        print(f"{r['side']:>6} {r['tokens']:>7} {r['degree']:>6} {r['step_ms']:>9.1f} "
              f"{r['speedup']:>8.2f} {r['cpu_ms']:>8.1f} {r['cpu_speedup']:>11.2f} "
              f"{100 * r['spread']:>6.0f}% {r['process_speedup']:>12.2f} "
              f"{r['work_inflation']:>5.2f} {r['rounds']:>6} {r['control_ms']:>10.2f}")
    problems = check_speedups(rows)
    print("plausibility (cpu clock): " + ("ok" if not problems else "; ".join(problems)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "devices": args.devices, "machine": machine,
                       "date": when, "repeats": args.repeats, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
