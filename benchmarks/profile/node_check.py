"""The two-device demo's start-up measurement, before and after the session-7 fix, against
a short in-run check on the node's own workers — for when the machine is too busy for the
demo's speed-up table to pass (the demo then refuses to replay) but the single-device
numbers can still be compared.

A round: (1) the engine process measures the profile as the demo did before the fix
(``--before``'s ``measure_profile``: one thread, unpinned, 3 repeats, no warm-up of the
decode); (2) the demo's measurement after it (``stable_median`` in the engine process, then
``measure_on_workers``: steps, encodes and decodes through the engine's commands on every
worker); (3) the in-run check: both workers at once, each serving 2 requests of every side
(256², 512², 1024²) as a replay job does — an encode, 10 steps, a tiled decode, each timed
engine-side like ``EngineDevices`` — and the seconds of each kind beside what each profile
predicts. Rounds alternate which measurement goes first.

    .venv/bin/python benchmarks/profile/node_check.py --before /tmp/profile_before \
        --rounds 2 --json benchmarks/profile/results/node_check.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import threading
import time
from pathlib import Path

SIDES = (256, 512, 1024)
TILE = (256, 224)


def old_measure(before: str):
    spec = importlib.util.spec_from_file_location(
        "profile_before", Path(before) / "ditmem/tools/profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.measure_profile


def in_run(node, steps: int = 10, per_side: int = 2) -> list[dict]:
    """Both workers at once: encode, ``steps`` steps and a tiled decode per request."""
    from ditmem.models.common.request import GenerationRequest

    out, lock = [], threading.Lock()

    def serve(device: int) -> None:
        for side in SIDES:
            for i in range(per_side):
                rid = f"check-{device}-{side}-{i}"
                r = GenerationRequest("a red fox in the snow", width=side, height=side,
                                      num_inference_steps=steps, seed=i, request_id=rid)
                t0 = time.perf_counter()
                node.encode(r, device)
                enc = time.perf_counter() - t0
                st = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    node.step([((device,), [rid])])
                    st.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                node.decode(rid, TILE)
                dec = time.perf_counter() - t0
                node.release(rid)
                with lock:
                    out.append({"device": device, "side": side, "encode_s": enc,
                                "steps_s": st, "decode_s": dec})

    threads = [threading.Thread(target=serve, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def ratios(profile: dict, samples: list[dict]) -> dict:
    from ditmem.scheduler import CostModel, Request
    from ditmem.scheduler.models import tokens_for

    cost = CostModel.from_dict(profile)
    meas = {"encodes": 0.0, "steps": 0.0, "decodes": 0.0}
    pred = dict.fromkeys(meas, 0.0)
    for s in samples:
        r = Request("x", 0.0, width=s["side"], height=s["side"])
        meas["encodes"] += s["encode_s"]
        pred["encodes"] += cost.encode_time(r)
        meas["steps"] += sum(s["steps_s"])
        pred["steps"] += len(s["steps_s"]) * cost.step_time(
            "qwen-image", [tokens_for("qwen-image", s["side"], s["side"], 1)])
        meas["decodes"] += s["decode_s"]
        pred["decodes"] += cost.decode_time(r)
    out = {k: meas[k] / pred[k] for k in meas}
    out["all"] = sum(meas.values()) / sum(pred.values())
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--before", required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    from ditmem import models
    from ditmem.parallel.node import NodeEngine
    from ditmem.parallel.node_profile import measure_on_workers
    from ditmem.scheduler.models import tokens_for
    from ditmem.tools.profile import measure_profile

    measure_before = old_measure(args.before)
    page = 64 * 1024
    pages = int(64 * 2**20) // page
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": []}
    with NodeEngine("tiny-qwen-image", 2, pool_pages=pages, page_bytes=page,
                    host_pages=4 * pages) as node:
        gen = models.load("tiny-qwen-image")

        def before():
            return measure_before(gen, "tiny-qwen-image", list(SIDES), [1, 2], 3,
                                  log=lambda *_: None, decode_tile=TILE)

        def after():
            prof = measure_profile(gen, "tiny-qwen-image", list(SIDES), [1, 2], 3,
                                   log=lambda *_: None, decode_tile=TILE)
            measure_on_workers(node, prof, "qwen-image", list(SIDES), lambda m: None,
                               tokens_for=lambda s: tokens_for("qwen-image", s, s, 1),
                               tile=TILE)
            return prof

        for k in range(args.rounds):
            load0 = os.getloadavg()[0]
            order = [("before", before), ("after", after)]
            if k % 2:
                order.reverse()
            profiles = {}
            for name, fn in order:
                t0 = time.perf_counter()
                profiles[name] = fn()
                profiles[name + "_seconds"] = time.perf_counter() - t0
            samples = in_run(node)
            row = {"round": k, "load_average": [load0, os.getloadavg()[0]],
                   "measure_s": {n: profiles[n + "_seconds"] for n, _ in order}}
            for name in ("before", "after"):
                row[name] = ratios(profiles[name], samples)
            res["rounds"].append(row)
            print(json.dumps(row), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(res, indent=2))
    for name in ("before", "after"):
        rows = [r[name] for r in res["rounds"]]
        print(f"{name}: " + "; ".join(
            f"{k} " + "/".join(f"x{r[k]:.2f}" for r in rows) for k in rows[0]))


if __name__ == "__main__":
    main()
