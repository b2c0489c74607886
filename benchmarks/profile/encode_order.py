"""Why the runs' encodes read x1.4-2.3 slower than the start-up profile: one encode timed
after what precedes it (pinned to one core, one thread, as a demo replay process).

Modes, interleaved sample by sample so that all see the same machine:

* ``back_to_back``: the previous op was an encode (the old profile's order);
* ``after_step``: two steps of another request (512², 1024 tokens) came just before
  (the order under packing policies: a request is admitted between the others' steps);
* ``after_decode``: another request's decode came just before (fifo's order: the previous
  request's decode, then the next one's encode).

Minor page faults during the timed encode are counted too (is it the allocator?).

    .venv/bin/python benchmarks/profile/encode_order.py --reps 9 \\
        --json benchmarks/profile/results/encode_order.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_path import _request  # noqa: E402

MODES = ("back_to_back", "after_step", "after_decode")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sides", default="256,1024")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--core", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.core})
    import torch

    from ditmem import models
    from ditmem.memory import PagePool

    torch.set_num_threads(1)
    gen = models.load("tiny-qwen-image")
    pool = PagePool(4096, 64 * 1024)
    ids = iter(range(10**9))

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def before(mode: str, side: int) -> None:
        if mode == "back_to_back":
            gen.release(gen.encode(_request(side, next(ids), 4), pool))
        elif mode == "after_step":
            p = gen.encode(_request(512, next(ids), 1000), pool)
            gen.step([p])
            gen.step([p])
            gen.release(p)
        else:
            p = gen.encode(_request(512, next(ids), 2), pool)
            while not gen.is_done(p):
                gen.step([p])
            gen.decode(p)
            gen.release(p)

    rows = []
    for side in (int(s) for s in args.sides.split(",")):
        samples = {m: ([], []) for m in MODES}
        for k in range(args.reps + 1):
            for mode in MODES:
                before(mode, side)
                f0, t0 = faults(), time.perf_counter()
                s = gen.encode(_request(side, next(ids), 4), pool)
                dt, df = time.perf_counter() - t0, faults() - f0
                gen.release(s)
                if k:  # the first round warms up
                    samples[mode][0].append(dt)
                    samples[mode][1].append(df)
        base = statistics.median(samples["back_to_back"][0])
        for mode in MODES:
            t, f = samples[mode]
            med = statistics.median(t)
            rows.append({"side": side, "mode": mode, "median_s": med, "ratio": med / base,
                         "min_s": min(t), "max_s": max(t), "faults_median": statistics.median(f)})
            print(f"{side:5d} {mode:<13} {1e3 * med:7.2f} ms  x{med / base:4.2f}  "
                  f"(min {1e3 * min(t):.2f}, max {1e3 * max(t):.2f}; minor faults "
                  f"{statistics.median(f):.0f})", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} ({time.strftime('%H:%M', time.gmtime())} UTC)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "load_avg": os.getloadavg()[0], "rows": rows}, fh,
                      indent=1)


if __name__ == "__main__":
    main()
