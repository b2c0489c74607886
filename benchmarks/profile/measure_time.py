"""How long the one-device demo's start-up measurement takes before and after the fix (one
process, alternating, same sides/batches/repeats as ``ditmem demo``).

    .venv/bin/python benchmarks/profile/measure_time.py --before /tmp/profile_before
"""

from __future__ import annotations

import argparse
import os
import time

from node_check import old_measure


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--before", required=True)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    os.sched_setaffinity(0, {0})
    from ditmem import models
    from ditmem.tools.profile import measure_profile

    gen = models.load("tiny-qwen-image")
    fns = {"before": old_measure(args.before), "after": measure_profile}
    for k in range(args.rounds):
        order = ["before", "after"] if k % 2 == 0 else ["after", "before"]
        for name in order:
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            fns[name](gen, "tiny-qwen-image", [256, 512, 1024], [1, 2, 4], 5,
                      log=lambda *_: None, decode_tile=(256, 224))
            print(f"round {k} {name}: {time.perf_counter() - t0:.1f} s (load {load:.1f})",
                  flush=True)


if __name__ == "__main__":
    main()
