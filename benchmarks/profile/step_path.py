"""Why the one-device demo's start-up profile reads fast: the profile's way of timing each
op beside the run's, side by side in one process (pinned to one core, one thread, as a
demo replay process).

Per round:

1. ``profile``: the demo's start-up measurement (``measure_profile``: back-to-back
   ``stable_median`` samples of each op);
2. ``in-run order``: each op timed as the run meets it — an encode right after another
   request's decode (fifo's order: decode A, encode B, steps of B), the first step of a
   request right after its encode, a decode after its request's last step; and the same
   op back to back (the profile's order) interleaved with it, so both see the same drift;
3. ``replay``: fifo through the real engine on a short trace at load ``--load`` built on
   that profile (``ditmem demo``'s replay path): per shape, the engine's step seconds
   (``StepReport.step_s``: the model call only) beside the profile's; the engine's own
   host work per iteration (the policy's decision ``schedule_s``, and the stages' wall
   minus the ops they timed), which no kind of the accuracy report counts; each step by
   what came before it (another step of the request, an encode or decode, an idle wait);
4. ``profile`` again: what the machine's drift did meanwhile (1 vs 4 brackets the replay).

    .venv/bin/python benchmarks/profile/step_path.py --rounds 2 --requests 40 \\
        --json benchmarks/profile/results/step_path.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from types import SimpleNamespace

SIDES = (256, 512, 1024)


def _request(side, i, steps):
    from ditmem.models.common.request import GenerationRequest
    from ditmem.tools.replay import PROMPTS

    return GenerationRequest(prompt=PROMPTS[i % len(PROMPTS)], width=side, height=side,
                             num_inference_steps=steps, seed=i, request_id=f"x{side}-{i}")


def _timed(fn, *args):
    """``(fn(*args), seconds it took)``."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def in_run_order(gen, pool, sides, reps: int) -> dict:
    """Per side, median seconds: encode / first step / decode as the run meets them
    ('run') and the same op back to back ('hot'), samples interleaved rep by rep."""
    out = {}
    counter = iter(range(10**9))
    other = sorted(sides)[len(sides) // 2]  # the previous request: the middle side
    for side in sides:
        enc_run, enc_hot, first, later, dec_run = [], [], [], [], []
        for _ in range(reps + 1):  # the first rep is a warm-up, discarded
            prev = gen.encode(_request(other, next(counter), 2), pool)
            while not gen.is_done(prev):
                gen.step([prev])
            gen.decode(prev)
            gen.release(prev)
            s, e1 = _timed(gen.encode, _request(side, next(counter), 4), pool)
            f = _timed(gen.step, [s])[1]
            rest = [_timed(gen.step, [s])[1] for _ in range(3)]
            d = _timed(gen.decode, s)[1]
            gen.release(s)
            hot = []
            for _ in range(3):  # the profile's order: encodes back to back
                h, dt = _timed(gen.encode, _request(side, next(counter), 1000), pool)
                hot.append(dt)
                gen.release(h)
            enc_run.append(e1)
            enc_hot.append(statistics.median(hot))
            first.append(f)
            later.append(statistics.median(rest))
            dec_run.append(d)
        med = lambda xs: statistics.median(xs[1:])  # noqa: E731
        out[side] = {"encode_after_decode_s": med(enc_run), "encode_back_to_back_s": med(enc_hot),
                     "first_step_s": med(first), "later_steps_s": med(later),
                     "decode_after_steps_s": med(dec_run)}
    return out


def replay_fifo(gen, profile_path: str, args) -> dict:
    """fifo through the engine on the demo's trace (``--requests``) built on the profile:
    per token count, the engine's step seconds beside the profile's; the host work."""
    from ditmem.engine.factory import EngineConfig, make_policy_and_cost, make_pools
    from ditmem.engine.loop import Engine
    from ditmem.scheduler import CostModel
    from ditmem.scheduler.policies.recorder import ObservingPolicy
    from ditmem.tools.demo import build_trace
    from ditmem.tools.demo_runs import warm_up
    from ditmem.tools.replay import replay

    demo_args = SimpleNamespace(workload="seed-mix", load=args.load, requests=args.requests,
                                seed=args.seed, arrival="poisson", divisor=2)
    cost = CostModel.load(profile_path)
    trace = build_trace(demo_args, cost)
    config = EngineConfig(model="tiny-qwen-image", pool_mb=64, page_kb=64, max_queued=512)
    policy, pcost = make_policy_and_cost("fifo", profile_path)
    tile = (256, 224)  # the demo's decode tile: fifo decodes whole, inline, as in the demo
    per_tokens: dict[int, list] = {}
    after: dict[str, dict[int, list]] = {"step": {}, "other": {}, "idle": {}}
    stage_wall, stage_ops, batches = [0.0], [0.0], []
    last = {"end": None, "kind": None}

    def on_report(rep):
        now = time.perf_counter()
        ops = rep.step_s + rep.encode_s + rep.decode_s + rep.transfer_s
        stage_wall[0] += now - rep.now
        stage_ops[0] += ops
        gap = None if last["end"] is None else rep.now - last["end"]
        if rep.batch and rep.step_s > 0:
            batches.append(len(rep.batch))
            if len(rep.batch) == 1:
                per_tokens.setdefault(rep.tokens[0], []).append(rep.step_s)
                # what came before this step: an idle wait (> 2 ms with no work), another
                # op in the same iteration or the last (encode / decode), or a step
                if gap is not None and gap > 0.002:
                    kind = "idle"
                elif rep.encode_s or rep.transfer_s or last["kind"] != "step":
                    kind = "other"
                else:
                    kind = "step"
                after[kind].setdefault(rep.tokens[0], []).append(rep.step_s)
        last["end"] = now
        last["kind"] = "decode" if rep.decode_s else ("step" if rep.step_s else "other")

    pool, host = make_pools(config, "cpu")
    warm_up(gen, trace, pool)
    engine = Engine(gen, ObservingPolicy(policy, on_report), pcost, pool, host,
                    model="qwen-image", max_queued=512, decode="inline", decode_tile=tile)
    engine.start()
    t0 = time.perf_counter()
    timings: list = []
    records, services = replay(engine, trace, timings=timings)
    wall = time.perf_counter() - t0
    engine.drain(60)
    stats = engine.stats()
    engine.stop()
    steps = {n: {"run_median_s": statistics.median(v), "run_mean_s": statistics.mean(v),
                 "steps": len(v), "profile_s": cost.step_time("qwen-image", [n]),
                 **{f"after_{k}": {"median_s": statistics.median(a[n]), "steps": len(a[n])}
                    for k, a in after.items() if a.get(n)}}
             for n, v in sorted(per_tokens.items())}
    enc = [t.encode_s for _, t in timings]
    dec = [(r, t.decode_s) for r, t in timings]
    return {"wall_s": wall, "steps": steps, "batch_sizes": sorted(set(batches)),
            "stage_wall_s": stage_wall[0], "stage_ops_s": stage_ops[0],
            "schedule_s": stats.schedule_s, "iterations": stats.iterations,
            "encode_run_median_s": statistics.median(enc),
            "encode_profile_s": cost.encode_time(trace[0]),
            "decode_ratio": sum(d for _, d in dec) / sum(cost.decode_time(r) for r, _ in dec),
            "busy_s": sum(services)}


def measure(gen, path: str) -> dict:
    from ditmem.tools.profile import measure_profile

    prof = measure_profile(gen, "tiny-qwen-image", list(SIDES), [1], 5, tool="step_path",
                           log=lambda *_: None, decode_tile=(256, 224))
    with open(path, "w") as f:
        json.dump(prof, f)
    pts = prof["models"]["qwen-image"]["step"]["points"]["value"]
    return {"steps": {p["tokens"]: p["seconds"] for p in pts},
            "encode_s": prof["models"]["qwen-image"]["encode_s"]["value"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=7, help="in-run-order samples per side")
    ap.add_argument("--core", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.core})
    import torch

    from ditmem import models
    from ditmem.memory import PagePool

    torch.set_num_threads(1)
    gen = models.load("tiny-qwen-image")
    pool = PagePool(4096, 64 * 1024)
    rounds = []
    for k in range(args.rounds):
        path = f"/tmp/step_path_profile_{os.getpid()}_{k}.json"
        t = time.strftime("%H:%M:%S", time.gmtime())
        before = measure(gen, path)
        order = in_run_order(gen, pool, SIDES, args.reps)
        rep = replay_fifo(gen, path, args)
        after = measure(gen, f"{path}.after")
        rounds.append({"started": t, "load_avg": os.getloadavg()[0], "profile_before": before,
                       "in_run_order": order, "replay": rep, "profile_after": after})
        print(f"round {k + 1} ({t} UTC, load average {os.getloadavg()[0]:.1f}; replay "
              f"{rep['wall_s']:.0f} s, batches {rep['batch_sizes']})")
        print(f"  {'tokens':>6} {'profile':>8} {'after':>8} {'run med':>8} {'run/prof':>8} "
              f"{'run/after':>9} {'steps':>6}")
        for n, s in rep["steps"].items():
            b, a = before["steps"][n], after["steps"][n]
            print(f"  {n:6d} {1e3 * b:7.2f}m {1e3 * a:7.2f}m {1e3 * s['run_median_s']:7.2f}m "
                  f"{s['run_median_s'] / b:8.3f} {s['run_median_s'] / a:9.3f} {s['steps']:6d}")
            print("         " + "; ".join(
                f"after {k}: {1e3 * s[f'after_{k}']['median_s']:.2f} ms x "
                f"{s[f'after_{k}']['steps']}" for k in ("step", "other", "idle")
                if f"after_{k}" in s))
        host = rep["stage_wall_s"] - rep["stage_ops_s"]
        print(f"  engine host work: decisions {rep['schedule_s']:.2f} s + stages' untimed part "
              f"{host:.2f} s over {rep['iterations']} iterations, against "
              f"{rep['stage_ops_s']:.1f} s of timed ops ("
              f"{100 * (rep['schedule_s'] + host) / rep['stage_ops_s']:.1f} %)")
        print(f"  encode: in run {1e3 * rep['encode_run_median_s']:.2f} ms vs profile "
              f"{1e3 * rep['encode_profile_s']:.2f} ms; decodes in run / profile "
              f"x{rep['decode_ratio']:.3f}")
        for side, o in order.items():
            print(f"  {side}: encode after a decode {1e3 * o['encode_after_decode_s']:.2f} ms vs "
                  f"back to back {1e3 * o['encode_back_to_back_s']:.2f} ms (x"
                  f"{o['encode_after_decode_s'] / o['encode_back_to_back_s']:.2f}); first step "
                  f"{1e3 * o['first_step_s']:.2f} vs later {1e3 * o['later_steps_s']:.2f} ms (x"
                  f"{o['first_step_s'] / o['later_steps_s']:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rounds": rounds}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
