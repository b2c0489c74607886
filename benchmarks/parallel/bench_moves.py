"""Where a move's time goes on the node engine: a paused request moved between devices
while its source device is idle vs while the source runs another request's step, side by
side (the baseline is the idle move in the same run).

    .venv/bin/python benchmarks/parallel/bench_moves.py [--side 256] [--busy-side 512]
        [--repeats 7] [--json PATH]

Each move is split with the workers' own timestamps (``MoveTiming``): ``wait`` (send to
the last device beginning the move: the pipe and the wait behind the worker's previous
command), ``copy`` (that last device's command: it waited for nobody), ``control`` (the
rest: the replies' way back). Also the fixed cost of a move command on idle workers
(``ditmem.parallel.move_latency``), which the demo writes into ``links.move_latency_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time


def _moves_behind_a_step(node, side: int, busy_side: int, repeats: int, steps: int):
    """(idle, busy) lists of MoveTiming: request ``m`` (``side``) moved 1 -> 0 and back
    with device 1 idle, then while device 1 runs a step of ``b`` (``busy_side``)."""
    from ditmem.models.common.request import GenerationRequest

    def req(rid, s, seed):
        return GenerationRequest("a move", width=s, height=s, num_inference_steps=steps,
                                 seed=seed, request_id=rid)

    assert node.encode(req("m", side, 1), 1) and node.encode(req("b", busy_side, 2), 1)
    idle, busy, step_s = [], [], []
    try:
        for _ in range(repeats):
            idle.append(node.move("m", (0,)))
            node.move("m", (1,))
            stepping = threading.Thread(target=lambda: step_s.append(
                node.step([((1,), ["b"])])[0].seconds))
            stepping.start()
            time.sleep(0.005)  # the step command is on device 1 first
            busy.append(node.move("m", (0,)))
            stepping.join()
            node.move("m", (1,))
    finally:
        node.release("m")
        node.release("b")
    return idle, busy, step_s


def _row(name: str, timings) -> dict:
    parts = [t.parts() for t in timings]
    return {"case": name, "moves": len(timings),
            "wall_ms": 1e3 * statistics.median(t.wall_s for t in timings),
            **{f"{k}_ms": 1e3 * statistics.median(p[k] for p in parts)
               for k in ("wait", "copy", "control")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-qwen-image")
    ap.add_argument("--side", type=int, default=256, help="the moved request's side, px")
    ap.add_argument("--busy-side", type=int, default=512,
                    help="side of the request whose step keeps the source busy, px")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if (os.cpu_count() or 1) < 2:
        ap.error("needs 2 cores (one worker process per device)")
    from ditmem.parallel.move_latency import measure_move_latency
    from ditmem.parallel.node import NodeEngine

    with NodeEngine(args.model, 2, pool_pages=4096, page_bytes=1 << 16,
                    host_pages=1024) as node:
        fixed = measure_move_latency(node, args.repeats)
        idle, busy, step_s = _moves_behind_a_step(node, args.side, args.busy_side,
                                                  args.repeats, steps=4 * args.repeats)
    rows = [_row(f"{args.side}px, source idle", idle),
            _row(f"{args.side}px, source mid-step ({args.busy_side}px)", busy)]
    step_ms = 1e3 * statistics.median(step_s)
    print(f"fixed cost per move command (idle workers, tiny request): "
          f"{1e3 * fixed['move_latency_s']:.2f} ms; by kind (ms): "
          + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in fixed["by_kind_s"].items()))
    print(f"{'case':<34} {'wall ms':>8} {'wait ms':>8} {'copy ms':>8} {'ctrl ms':>8}")
    for r in rows:
        print(f"{r['case']:<34} {r['wall_ms']:8.2f} {r['wait_ms']:8.2f} {r['copy_ms']:8.2f} "
              f"{r['control_ms']:8.2f}")
    print(f"the busy source's step: {step_ms:.1f} ms (median); a move behind it costs "
          f"x{rows[1]['wall_ms'] / rows[0]['wall_ms']:.1f} the idle one")
    if args.json:
        meta = {"command": "bench_moves", "machine": f"{platform.node()} "
                f"({os.cpu_count()} cores)", "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime()),
                "load_average": os.getloadavg()[0], "step_ms": step_ms, "fixed": fixed}
        with open(args.json, "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
