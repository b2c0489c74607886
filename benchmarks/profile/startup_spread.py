"""Why the demos' start-up profile misses the run: small experiments, one process.

* ``--exp cold``: raw samples of the ops the profile times, right after the model loads
  (first calls included): step 1024² batch 1, a 256² decode, an encode — is the first call,
  or the first few, slower than the rest (allocator, oneDNN primitive caches)?
* ``--exp repeat``: the one-device demo's start-up measurement (``measure_profile``, sides
  256/512/1024, batches 1/2/4, 5 repeats) ``--rounds`` times back to back in one process:
  the spread of its key numbers between measurements minutes apart.
* ``--exp busy``: the same measurement with the other core idle, then with a second process
  pinned to the other core stepping the model (what both cores do during the demo's
  parallel replays), then idle again.

    .venv/bin/python benchmarks/profile/startup_spread.py --exp cold,repeat,busy \
        --json benchmarks/profile/results/startup_spread.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time

SIDES = (256, 512, 1024)


def _load():
    import torch

    from ditmem import models

    torch.set_num_threads(1)
    return models.load("tiny-qwen-image")


def _request(side, i, steps):
    from ditmem.models.common.request import GenerationRequest
    from ditmem.tools.replay import PROMPTS

    return GenerationRequest(prompt=PROMPTS[i % len(PROMPTS)], width=side, height=side,
                             num_inference_steps=steps, seed=i, request_id=f"x{side}-{i}")


def _pool():
    from ditmem.memory import PagePool

    return PagePool(4096, 64 * 1024)


def cold(gen, n: int = 12) -> dict:
    """Raw seconds of the first ``n`` calls of each op, in call order."""
    pool = _pool()
    out = {}
    t = []
    for i in range(n):
        t0 = time.perf_counter()
        s = gen.encode(_request(256, i, 1000), pool)
        t.append(time.perf_counter() - t0)
        gen.release(s)
    out["encode_256"] = t
    s = gen.encode(_request(1024, 0, 1000), pool)
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        gen.step([s])
        t.append(time.perf_counter() - t0)
    gen.release(s)
    out["step_1024_b1"] = t
    t = []
    for i in range(n):
        s = gen.encode(_request(256, i, 2), pool)
        while not gen.is_done(s):
            gen.step([s])
        t0 = time.perf_counter()
        gen.decode(s)
        t.append(time.perf_counter() - t0)
        gen.release(s)
    out["decode_256"] = t
    return out


def key_numbers(profile: dict) -> dict:
    m = next(iter(profile["models"].values()))
    pts = m["step"]["points"]["value"]
    out = {f"step_{p['tokens']}_b{p['batch']}_ms": 1e3 * p["seconds"] for p in pts}
    out["encode_ms"] = 1e3 * m["encode_s"]["value"]
    out["tile_ms"] = 1e3 * m["decode_tile_s"]["value"]
    return out


def one_measurement(gen) -> dict:
    from ditmem.tools.profile import measure_profile

    t0 = time.perf_counter()
    p = measure_profile(gen, "tiny-qwen-image", list(SIDES), [1, 2, 4], 5,
                        log=lambda *_: None, decode_tile=(256, 224))
    return dict(key_numbers(p), seconds=time.perf_counter() - t0)


def _stepper(core: int, stop) -> None:
    os.sched_setaffinity(0, {core})
    gen = _load()
    pool = _pool()
    s = gen.encode(_request(512, 0, 10**6), pool)
    while not stop.is_set():
        gen.step([s])


def spread(rows: list[dict]) -> dict:
    keys = [k for k in rows[0] if k != "seconds"]
    return {k: {"min": min(r[k] for r in rows), "median": statistics.median(r[k] for r in rows),
                "max": max(r[k] for r in rows),
                "max/min": max(r[k] for r in rows) / min(r[k] for r in rows)} for k in keys}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--exp", default="cold,repeat,busy")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    os.sched_setaffinity(0, {0})
    gen = _load()
    res = {"load_average_start": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                         time.gmtime())}
    exps = args.exp.split(",")
    if "cold" in exps:
        res["cold"] = cold(gen)
        for k, v in res["cold"].items():
            print(f"cold {k}: first {1e3 * v[0]:.1f} ms, 2nd {1e3 * v[1]:.1f}, median of rest "
                  f"{1e3 * statistics.median(v[2:]):.1f}, min {1e3 * min(v):.1f}, max "
                  f"{1e3 * max(v):.1f}", flush=True)
    if "repeat" in exps:
        rows = [one_measurement(gen) for _ in range(args.rounds)]
        res["repeat"] = {"rows": rows, "spread": spread(rows)}
        for k, v in res["repeat"]["spread"].items():
            print(f"repeat {k}: {v['min']:.1f}-{v['max']:.1f} (max/min x{v['max/min']:.2f})",
                  flush=True)
    if "busy" in exps:
        ctx = mp.get_context("spawn")
        rows = {"idle before": one_measurement(gen)}
        stop = ctx.Event()
        proc = ctx.Process(target=_stepper, args=(1, stop))
        proc.start()
        time.sleep(15)  # the stepper loads and starts stepping
        rows["other core stepping"] = one_measurement(gen)
        stop.set()
        proc.join()
        rows["idle after"] = one_measurement(gen)
        res["busy"] = rows
        base = {k: (rows["idle before"][k] + rows["idle after"][k]) / 2
                for k in rows["idle before"]}
        for k in base:
            print(f"busy {k}: idle {base[k]:.1f}, other core stepping "
                  f"{rows['other core stepping'][k]:.1f} "
                  f"(x{rows['other core stepping'][k] / base[k]:.2f})", flush=True)
    res["load_average_end"] = os.getloadavg()
    if args.json:
        os.makedirs(os.path.dirname(args.json), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
