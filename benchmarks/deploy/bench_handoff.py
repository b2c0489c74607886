"""What handing a parked request to another engine costs, against what it saves.

For each size, a tiny-qwen-image request runs ``k`` of its steps on engine A (driven
iteration by iteration on this thread), then is handed to engine B
(:mod:`ditmem.engine.handoff`): the table gives the export (offload through A's host pool,
pages read out), the adopt (pages written into B's host pool), the restore on B (its first
iteration there), the blob's size, and — the baseline, measured in the same run — the time
those ``k`` steps took on A, which a request restarted from step 0 on another replica (a
re-route, no migration) runs again. ``--ray`` adds the object store's share: ``ray.put`` of
the blob and ``ray.get`` of it from another worker process. Median of ``--repeats``.

    python benchmarks/deploy/bench_handoff.py [--sizes 256 512 1024] [--steps 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time

log = logging.getLogger("bench_handoff")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--at", type=float, default=0.5, help="hand off after this share of steps")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--page-kb", type=int, default=64)
    p.add_argument("--ray", action="store_true", help="also time ray.put / remote ray.get")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def make_engine(gen, page_bytes):
    from ditmem.engine.factory import make_policy_and_cost
    from ditmem.engine.loop import Engine
    from ditmem.memory import HostPool, PagePool

    policy, cost = make_policy_and_cost("slo", "cpu-tiny")
    pages = (64 << 20) // page_bytes
    return Engine(gen, policy, cost, PagePool(pages, page_bytes), HostPool(pages, page_bytes))


def one(gen, side, steps, k, page_bytes, getter):
    """Seconds of (k steps on A, export, adopt, restore on B, object store) and bytes."""
    from ditmem.engine.handoff import adopt_blob, export_parked
    from ditmem.models.common.request import GenerationRequest

    a, b = make_engine(gen, page_bytes), make_engine(gen, page_bytes)
    req = GenerationRequest(prompt="a lighthouse at dusk", width=side, height=side,
                            num_inference_steps=steps, seed=1, request_id="r")
    a.submit(req, slo_ms=3_600_000)
    a.executor.iterate()  # admit + encode (+ maybe its first step)
    t0 = time.perf_counter()
    first = a.executor.active["r"].status.steps_done
    while a.executor.active["r"].status.steps_done < k:
        a.executor.iterate()
    redo = (time.perf_counter() - t0) * k / max(1, k - first)
    t0 = time.perf_counter()
    blob = export_parked(a, "r")
    t1 = time.perf_counter()
    store = getter(blob) if getter is not None else 0.0
    t2 = time.perf_counter()
    adopt_blob(b, blob)
    t3 = time.perf_counter()
    job = b.executor.active["r"]
    handle = b.executor.stages.start_restore(job)
    b.executor.stages.finish_restore(job, handle)
    t4 = time.perf_counter()
    b.executor.finish(job, error=RuntimeError("benchmark done"))
    return {"redo_s": redo, "export_s": t1 - t0, "store_s": store, "adopt_s": t3 - t2,
            "restore_s": t4 - t3, "bytes": blob.nbytes, "pages": blob.num_pages}


def ray_getter():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)

    @ray.remote
    def fetch(refs):
        t0 = time.perf_counter()
        ray.get(refs[0])
        return time.perf_counter() - t0

    def put_get(blob):
        t0 = time.perf_counter()
        ref = ray.put(blob)
        put = time.perf_counter() - t0
        return put + ray.get(fetch.remote([ref]))

    ray.get(fetch.remote([ray.put(b"warm-up")]))  # the worker process starts here
    return put_get


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from ditmem import models
    from ditmem.engine.threads import set_torch_threads

    set_torch_threads(1)
    gen = models.load("tiny-qwen-image")
    getter = ray_getter() if args.ray else None
    k = max(1, int(args.at * args.steps))
    rows = []
    for side in args.sizes:
        runs = [one(gen, side, args.steps, k, args.page_kb * 1024, getter)
                for _ in range(args.repeats)]
        row = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        row["handoff_s"] = row["export_s"] + row["store_s"] + row["adopt_s"] + row["restore_s"]
        row.update(size=side, k=k, steps=args.steps, ratio=row["handoff_s"] / row["redo_s"])
        rows.append(row)
    head = (f"{'size':>9} {'k':>3} {'blob MiB':>8} {'export ms':>9} {'store ms':>8} "
            f"{'adopt ms':>8} {'restore ms':>10} {'hand-off ms':>11} {'redo k ms':>9} "
            f"{'ratio':>6}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['size']:>4}x{r['size']:<4} {r['k']:>3} {r['bytes'] / 2**20:>8.2f} "
                     f"{1e3 * r['export_s']:>9.2f} {1e3 * r['store_s']:>8.2f} "
                     f"{1e3 * r['adopt_s']:>8.2f} {1e3 * r['restore_s']:>10.2f} "
                     f"{1e3 * r['handoff_s']:>11.2f} {1e3 * r['redo_s']:>9.1f} "
                     f"{r['ratio']:>6.3f}")
    log.info("\n".join(lines))
    out = {"rows": rows, "args": vars(args), "machine": platform.platform(),
           "cpus": os.cpu_count(), "load": os.getloadavg(), "date": time.strftime("%F %T")}
    log.info("load average %.1f %.1f %.1f", *out["load"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
