"""Where a move's time goes on the node engine, and what a point-to-point move saves: a
paused request re-sharded between devices while they are idle, while its source runs
another request's step, and (``--devices 4``) while a device the move does not involve
runs a step — each done both ways side by side, interleaved in one run: the session-5
move (a collective over the smallest aligned group covering source and destination,
``NodeEngine.move(over_cover=True)``, the baseline) and the point-to-point move (only the
source and destination workers, the default).

    .venv/bin/python benchmarks/parallel/bench_moves.py [--devices 2|4] [--side 256]
        [--busy-side 512] [--repeats 7] [--json PATH]

Each move is split with the workers' own timestamps (``MoveTiming``): ``wait`` (send to
the last device beginning the move: the pipe and the wait behind the worker's previous
command), ``copy`` (that last device's command: it waited for nobody), ``control`` (the
rest: the replies' way back). Also the fixed cost of a move command on idle workers
(``ditmem.parallel.move_latency``), which the demo writes into ``links.move_latency_s``.
With 4 devices on a 2-core machine the workers share cores (a correctness-scale run: the
copy times are inflated, the waits are what to read).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

WAYS = {"cover (session 5)": True, "p2p": False}


def _request(rid: str, side: int, seed: int, steps: int):
    from ditmem.models.common.request import GenerationRequest

    return GenerationRequest("a move", width=side, height=side, num_inference_steps=steps,
                             seed=seed, request_id=rid)


def _behind(node, busy_device: int, src: int, dst: int, over_cover: bool):
    """(timing, busy step seconds): m moved src -> dst while ``busy_device`` steps b (the
    step command first), then moved back."""
    from ditmem.parallel import commands as cmd

    stepping = node.submit({busy_device: cmd.Step(["b"], (busy_device,))})
    time.sleep(0.005)  # the step is running on its worker
    timing = node.move("m", (dst,), over_cover=over_cover)
    step_s = stepping[busy_device].result(timeout=600).seconds
    node.move("m", (src,), over_cover=over_cover)
    return timing, step_s


def _cases(node, devices: int, side: int, busy_side: int, repeats: int) -> dict:
    """{(case, way): [MoveTiming]} and the busy steps' seconds, every way interleaved."""
    far = devices - 1  # the busy device of the uninvolved case (4 devices: 3)
    assert node.encode(_request("m", side, 1, 2), 1)
    assert node.encode(_request("b", busy_side, 2, 8 * repeats * len(WAYS)), 1)
    out: dict = {}
    steps = []
    try:
        for _ in range(repeats):
            for way, over_cover in WAYS.items():
                out.setdefault(("idle, 1 -> 0", way), []).append(
                    node.move("m", (0,), over_cover=over_cover))
                node.move("m", (1,), over_cover=over_cover)
                t, s = _behind(node, 1, 1, 0, over_cover)
                out.setdefault(("source mid-step, 1 -> 0", way), []).append(t)
                steps.append(s)
        if devices >= 4:
            node.release("b")
            assert node.encode(_request("b", busy_side, 2, 8 * repeats * len(WAYS)), far)
            for _ in range(repeats):
                for way, over_cover in WAYS.items():
                    t, s = _behind(node, far, 1, 2, over_cover)
                    out.setdefault((f"device {far} mid-step (uninvolved), 1 -> 2", way),
                                   []).append(t)
                    steps.append(s)
    finally:
        node.release("m")
        node.release("b")
    return {"timings": out, "step_s": steps}


def _row(case: str, way: str, timings) -> dict:
    parts = [t.parts() for t in timings]
    return {"case": case, "way": way, "moves": len(timings),
            "devices_involved": len(timings[0].queued_s),
            "wall_ms": 1e3 * statistics.median(t.wall_s for t in timings),
            **{f"{k}_ms": 1e3 * statistics.median(p[k] for p in parts)
               for k in ("wait", "copy", "control")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-qwen-image")
    ap.add_argument("--devices", type=int, default=2, choices=(2, 4),
                    help="workers (4: adds the uninvolved-device case)")
    ap.add_argument("--side", type=int, default=256, help="the moved request's side, px")
    ap.add_argument("--busy-side", type=int, default=512,
                    help="side of the request whose step keeps a device busy, px")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if (os.cpu_count() or 1) < 2:
        ap.error("needs 2 cores (one worker process per device)")
    from ditmem.parallel.move_latency import measure_move_latency
    from ditmem.parallel.node import NodeEngine

    with NodeEngine(args.model, args.devices, pool_pages=4096, page_bytes=1 << 16,
                    host_pages=1024) as node:
        fixed = measure_move_latency(node, args.repeats)
        got = _cases(node, args.devices, args.side, args.busy_side, args.repeats)
    cases = list(dict.fromkeys(case for case, _ in got["timings"]))
    rows = [_row(case, way, got["timings"][(case, way)]) for case in cases for way in WAYS]
    step_ms = 1e3 * statistics.median(got["step_s"])
    print(f"fixed cost per move command (idle workers, tiny request, p2p): "
          f"{1e3 * fixed['move_latency_s']:.2f} ms; by kind (ms): "
          + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in fixed["by_kind_s"].items()))
    print(f"{args.side}px request moved, {args.devices} workers, median of {args.repeats}")
    print(f"{'case':<44} {'way':<18} {'devs':>4} {'wall ms':>8} {'wait ms':>8} "
          f"{'copy ms':>8} {'ctrl ms':>8}")
    for r in rows:
        print(f"{r['case']:<44} {r['way']:<18} {r['devices_involved']:>4} {r['wall_ms']:8.2f} "
              f"{r['wait_ms']:8.2f} {r['copy_ms']:8.2f} {r['control_ms']:8.2f}")
    print(f"the busy device's step: {step_ms:.1f} ms (median); p2p / cover wall time:")
    by = {(r["case"], r["way"]): r for r in rows}
    for case in dict.fromkeys(r["case"] for r in rows):
        ratio = by[(case, "p2p")]["wall_ms"] / by[(case, "cover (session 5)")]["wall_ms"]
        print(f"  {case}: x{ratio:.2f}")
    if args.json:
        meta = {"command": "bench_moves", "machine": f"{platform.node()} "
                f"({os.cpu_count()} cores)", "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime()),
                "load_average": os.getloadavg()[0], "devices": args.devices,
                "step_ms": step_ms, "fixed": fixed}
        with open(args.json, "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
