"""GPU check (CUDA): offload/restore bandwidth vs a raw pinned copy, and transfer hidden
behind compute on the side stream. Not runnable on a CPU-only machine (exits with 2).

    python benchmarks/memory/gpu_overlap.py [--quick] [--json PATH] [--page-kib 1024]
                                            [--wan-layers 40]

For each state (Qwen-Image 1024^2; Wan2.2 720p x 81 frames with cross-attention K/V for
``--wan-layers`` layers, both CFG branches):
1. ``raw``: one contiguous device buffer of the same bytes copied to pinned host memory
   and back (``copy_(non_blocking=True)`` + synchronize); ``ours``: ``offload`` + shuffle
   the device free list + ``restore``, synchronized; ratio = raw / ours.
2. overlap: bf16 matmuls on the compute stream sized to take about as long as the
   transfer; ``start_offload`` + compute + ``finish_offload`` + ``start_restore`` + compute
   + ``finish_restore``. hidden = (compute + transfer - both) / transfer (1.0: fully hidden).
3. The state is checked bit-exactly after every round trip.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_offload import (  # noqa: E402
    qwen_state_tensors,
    shuffle_free_pages,
    state_pages,
    wan_state_tensors,
)
from common import print_table, write_json  # noqa: E402

from ditmem.memory import HostPool, OffloadEngine, PagePool, RequestState  # noqa: E402


def synced(fn, device) -> float:
    """Seconds ``fn()`` takes, with the device idle before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def check(state, tensors, device) -> None:
    for key, (x, _) in tensors.items():
        y = state.get(key)
        assert torch.equal(y.view(torch.uint8).cpu(), x.view(torch.uint8)), key


def run_state(name, tensors, page_bytes, repeats, device, rng) -> dict:
    nbytes = sum(x.numel() * x.element_size() for x, _ in tensors.values())
    n = state_pages(tensors, page_bytes) + 2 * len(tensors)
    pool = PagePool(n, page_bytes, device)
    host = HostPool(n, page_bytes, device=device)
    eng = OffloadEngine(pool, host)
    assert device.type == "cpu" or (eng.mode == "stream" and host.is_pinned)
    state = RequestState(pool, name)
    for key, (x, row_ndim) in tensors.items():
        assert state.put(key, x.to(device), row_ndim=row_ndim) is not None
    raw_dev = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    raw_host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=host.is_pinned)

    def raw():
        raw_host.copy_(raw_dev, non_blocking=True)
        raw_dev.copy_(raw_host, non_blocking=True)

    def ours() -> float:  # the free-list shuffle between the halves is not timed
        t = synced(lambda: state.offload(eng), device)
        shuffle_free_pages(pool, rng)
        return t + synced(lambda: state.restore(eng), device)

    t_raw, t_ours = [], []
    for i in range(repeats + 1):
        a, b = synced(raw, device), ours()
        if i:
            t_raw.append(a)
            t_ours.append(b)
    check(state, tensors, device)
    transfer = statistics.median(t_ours)

    # compute sized to about the transfer time
    size = 4096 if device.type == "cuda" else 256
    m = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    one = statistics.median(synced(lambda: m @ m, device) for _ in range(5))
    iters = max(1, round(transfer / 2 / one))

    def compute():
        for _ in range(iters):
            m @ m

    def offload_during_compute():
        h = state.start_offload(eng)
        compute()
        eng.finish_offload(h)

    def restore_during_compute():
        h = state.start_restore(eng)
        compute()
        eng.finish_restore(h)

    def both() -> float:
        t = synced(offload_during_compute, device)
        shuffle_free_pages(pool, rng)
        return t + synced(restore_during_compute, device)

    t_c, t_b = [], []
    for i in range(repeats + 1):
        c = synced(lambda: (compute(), compute()), device)
        b = both()
        if i:
            t_c.append(c)
            t_b.append(b)
    check(state, tensors, device)
    c, b = statistics.median(t_c), statistics.median(t_b)
    eng.close()
    r = statistics.median(t_raw)
    return {"state": name, "page_kib": page_bytes >> 10, "data_mb": nbytes / 1e6,
            "raw_ms": r * 1e3, "ours_ms": transfer * 1e3,
            "raw_gb_s": 2 * nbytes / r / 1e9, "ours_gb_s": 2 * nbytes / transfer / 1e9,
            "ratio": r / transfer, "compute_ms": c * 1e3, "both_ms": b * 1e3,
            "hidden": (c + transfer - b) / transfer}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--page-kib", default="256,1024")
    ap.add_argument("--wan-layers", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--device", default="cuda",
                    help="cuda (the measurement) or cpu (a dry run of the script's logic)")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("gpu_overlap.py needs a CUDA device (torch.cuda.is_available() is False); "
              "--device cpu only dry-runs it", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda", torch.cuda.current_device())
    layers = args.wan_layers or (4 if args.quick else 40)
    repeats = args.repeats or (3 if args.quick else 9)
    g = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    states = {"qwen-1024": qwen_state_tensors(g),
              f"wan-720p/{layers}L": wan_state_tensors(g, layers)}
    rows = [run_state(name, t, int(kib) << 10, repeats, device, rng)
            for name, t in states.items() for kib in args.page_kib.split(",")]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"
    print(f"{name}: offload+restore vs raw pinned copy, and "
          f"overlap with bf16 matmuls (median of {repeats})")
    print_table(rows, ["state", "page_kib", "data_mb", "raw_ms", "ours_ms", "raw_gb_s",
                       "ours_gb_s", "ratio", "compute_ms", "both_ms", "hidden"])
    write_json(args.json, "memory.gpu_overlap", args, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
