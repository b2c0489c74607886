"""How much this machine's speed drifts over minutes: the same ops timed again and again.

Every few seconds for ``--minutes``: the median of 3 steps of a 1024² batch-1 request and
one 256² decode (warm), one process pinned to core 0, one torch thread. Prints the spread
(max/min of the per-sample values, and of 30 s windows' medians) — what a start-up
measurement taken at one moment can be off from the rest of a run by.

    .venv/bin/python benchmarks/profile/drift.py --minutes 5 \
        --json benchmarks/profile/results/drift.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    os.sched_setaffinity(0, {0})
    import torch

    torch.set_num_threads(1)
    from ditmem import models
    from ditmem.memory import PagePool
    from ditmem.models.common.request import GenerationRequest

    gen = models.load("tiny-qwen-image")
    pool = PagePool(4096, 64 * 1024)

    def req(side, steps, i=0):
        return GenerationRequest(prompt="a red fox in the snow", width=side, height=side,
                                 num_inference_steps=steps, seed=i, request_id=f"d{side}-{i}")

    big = gen.encode(req(1024, 10**6), pool)
    for _ in range(3):
        gen.step([big])
    samples = []
    t_start = time.perf_counter()
    i = 0
    while time.perf_counter() - t_start < 60 * args.minutes:
        steps = []
        for _ in range(3):
            t0 = time.perf_counter()
            gen.step([big])
            steps.append(time.perf_counter() - t0)
        s = gen.encode(req(256, 2, i), pool)
        while not gen.is_done(s):
            gen.step([s])
        t0 = time.perf_counter()
        gen.decode(s)
        dec = time.perf_counter() - t0
        gen.release(s)
        samples.append({"t": time.perf_counter() - t_start,
                        "step_ms": 1e3 * statistics.median(steps),
                        "decode_ms": 1e3 * dec})
        i += 1
        time.sleep(1.5)
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load_average": os.getloadavg(), "samples": samples}
    for k in ("step_ms", "decode_ms"):
        v = [s[k] for s in samples]
        windows = {}
        for s in samples:
            windows.setdefault(int(s["t"] // 30), []).append(s[k])
        med = [statistics.median(w) for w in windows.values()]
        out[k] = {"min": min(v), "median": statistics.median(v), "max": max(v),
                  "window_medians": med, "window_max/min": max(med) / min(med)}
        print(f"{k}: samples {min(v):.1f}-{max(v):.1f} (median {statistics.median(v):.1f}); "
              f"30 s window medians {min(med):.1f}-{max(med):.1f} "
              f"(x{max(med) / min(med):.2f})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
