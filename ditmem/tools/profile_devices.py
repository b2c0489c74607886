"""``ditmem profile --devices N``: the profile's ``parallel`` section, measured.

Starts a node engine with ``N`` device workers (on CPU: processes pinned to cores), times
one request's step at every degree 1, 2, 4, ... <= N side by side
(:func:`ditmem.parallel.speedup.measure_speedups`) for each ``--parallel-sides`` side, and
returns ``{"<model key>": {"tokens": [...], "speedup": {"1": [...], "2": [...]},
"source": "measured by ditmem profile --devices N on <machine>, <date>; ..."}}`` and the
``links`` section (peer link measured between devices 0 and 1).
"""

from __future__ import annotations

import argparse
import os
import platform
import time


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    """``--devices``, ``--parallel-sides``, ``--parallel-clock``."""
    p.add_argument("--devices", type=int, default=1,
                   help="also measure the sequence-parallel speed-up table on this many "
                        "devices (CPU: worker processes pinned to cores, <= cores); 1: skip")
    p.add_argument("--parallel-sides", default="256,512,1024",
                   help="square image sides of the speed-up table (with --devices > 1)")
    p.add_argument("--parallel-clock", choices=("cpu", "process", "wall"), default="cpu",
                   help="ratio of the workers' main-thread CPU time (default: robust when "
                        "other jobs share the cores), of all their threads' CPU time "
                        "(the collective backend's copies included) or of wall time")


def check_device_arguments(args, device_count: int | None = None) -> str | None:
    """A usage error for bad ``--devices`` / ``--parallel-sides`` values, or ``None``."""
    cores = device_count or os.cpu_count() or 1
    if args.devices < 1:
        return f"--devices must be >= 1, got {args.devices}"
    if args.devices > cores:
        return f"--devices {args.devices} exceeds the {cores} devices (cores) of this machine"
    try:
        sides = [int(s) for s in args.parallel_sides.split(",")]
    except ValueError:
        return f"--parallel-sides: expected comma-separated integers, got {args.parallel_sides!r}"
    if not sides or any(s <= 0 or s % 16 for s in sides):
        return f"--parallel-sides: sides must be positive multiples of 16, got {sides}"
    return None


def measure_parallel(args, key: str, host_bytes_per_s: float, log=print
                     ) -> tuple[dict, dict]:
    """The ``parallel`` section for model ``key`` (see module docstring) and the
    ``links`` section: the peer link measured on devices 0 and 1, the host link as given
    (the profile's measured host copy rate). Raises ``speedup.CalibrationError`` when the
    speed-up measurement stays implausible (``speedup.calibrate``)."""
    from ditmem.parallel.node import NodeEngine
    from ditmem.parallel.speedup import calibrate, speedup_table
    from ditmem.scheduler.models import tokens_for

    sides = sorted(int(s) for s in args.parallel_sides.split(","))
    page = args.page_kb * 1024
    pages = max(64, int(256 * 2**20) // page)
    log(f"parallel: degrees up to {args.devices}, sides {sides}, {args.repeats} rounds")
    with NodeEngine(args.model, args.devices, pool_pages=pages, page_bytes=page,
                    host_pages=64) as node:
        rows = calibrate(node, sides, max(5, args.repeats), clock=args.parallel_clock,
                         tokens_for=lambda s: tokens_for(key, s, s, args.frames),
                         frames=args.frames, report=log)
        peer = node.peer_link_rate((0, 1))
        from ditmem.parallel.move_latency import measure_move_latency

        moves = measure_move_latency(node)
        from ditmem.parallel.job_latency import measure_job_latency

        jobs = measure_job_latency(node)
    rounds = sorted({r["rounds"] for r in rows})
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = f"{platform.node()} ({os.cpu_count()} cores)"
    source = (f"measured by ditmem profile --devices {args.devices} on {machine}, {when}; "
              f"{args.parallel_clock} time, median of {rounds[0]}-{rounds[-1]} interleaved "
              "rounds of 2 steps, checked plausible; one worker process per device")
    links = {"device_bytes_per_s": peer, "host_bytes_per_s": host_bytes_per_s,
             "source": f"measured by ditmem profile --devices {args.devices} on {machine}, "
                       f"{when}: peer = median broadcast of 32 MiB between devices 0 and 1 "
                       "(gloo between worker processes on CPU); host = the profile's "
                       "host_link_bytes_per_s"}
    links["move_latency_s"] = moves["move_latency_s"]
    links["move_latency_measured"] = dict(moves, source=f"measured on the idle workers, {when}")
    links["job_latency_s"] = jobs["job_latency_s"]
    links["job_latency_measured"] = dict(jobs, source=f"measured on the idle workers, {when}")
    log(f"  job latency {1e3 * jobs['job_latency_s']:.2f} ms per job besides its stages")
    log(f"  peer link {peer / 1e9:.2f} GB/s")
    return {key: speedup_table(rows, source, args.parallel_clock)}, links
