"""Offload + restore of request states through OffloadEngine vs a raw copy_ of the same bytes.

    python benchmarks/memory/bench_offload.py [--quick] [--json PATH] [--page-kib 64,256,1024]

States (CPU "device" pool and CPU host pool, as on this machine):
* qwen-1024: Qwen-Image 1024x1024 — packed latents [1, 4096, 64] fp32 (1 MiB), prompt
  embeddings [1, 300, 3584] bf16 (2.1 MB) and masks for the cond and uncond CFG branches.
* wan-720p/L: Wan2.2 720p x 81 frames — latents [1, 16, 21, 90, 160] fp32 (19 MB) and the
  cached cross-attention K/V [512, 40, 128] bf16 per layer and CFG branch, for L layers
  (40 in the real model; scaled down to fit this machine).

Each repeat offloads the whole state (start + finish), shuffles the device pool's free
list, restores it (start + finish, landing in scattered pages); the baseline copies one
contiguous buffer of the same data bytes to a host buffer and back (``copy_``), in the same
repeat. "cold": every timed operation starts with cold caches (64 MiB written first), as
a state parked between steps would; "warm": back to back. The state is checked
bit-exactly at the end. ratio = median over repeats of raw time / our time (1.0 = as fast
as a raw copy; both include their Python overhead). ratio_kernel: the same with the
engine calling the C++ kernel behind ``ditmem.ops.copy_blocks`` directly (``copy_fn``),
i.e. without the public op's input validation, to show what that validation costs.
"""

from __future__ import annotations

import argparse
import functools
import math
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_json  # noqa: E402

from ditmem.memory import (  # noqa: E402
    HostPool,
    OffloadEngine,
    PagePool,
    RequestState,
    pages_for,
)


def qwen_state_tensors(g) -> dict[str, tuple[torch.Tensor, int | None]]:
    out = {"latents": (torch.randn(1, 4096, 64, generator=g), None)}
    for branch in ("cond", "uncond"):
        out[f"prompt_embeds.{branch}"] = (torch.randn(1, 300, 3584, generator=g).bfloat16(),
                                          None)
        out[f"prompt_mask.{branch}"] = (torch.ones(1, 300, dtype=torch.int64), None)
    return out


def wan_state_tensors(g, layers: int) -> dict[str, tuple[torch.Tensor, int | None]]:
    out = {"latents": (torch.randn(1, 16, 21, 90, 160, generator=g), None)}
    for layer in range(layers):
        for branch in ("cond", "uncond"):
            for kv in ("k", "v"):
                x = torch.randn(512, 40, 128, generator=g).bfloat16()
                out[f"cross_{kv}.{layer}.{branch}"] = (x, 2)
    return out


def shuffle_free_pages(pool: PagePool, rng: random.Random) -> None:
    """Take every free page and give them back in random order."""
    pages = pool.allocate(pool.num_free_pages)
    rng.shuffle(pages)
    for p in pages:
        pool.free([p])


def state_pages(tensors, page_bytes: int) -> int:
    """Pages a RequestState holding ``tensors`` (as put with their row_ndim) needs."""
    total = 0
    for x, row_ndim in tensors.values():
        k = row_ndim or 0
        row_shape = tuple(x.shape[x.dim() - k:])
        total += pages_for(x.numel() // max(1, math.prod(row_shape)), row_shape, x.dtype,
                           page_bytes)
    return total


@functools.cache
def _scratch() -> torch.Tensor:
    return torch.zeros(64 << 20, dtype=torch.uint8)


def flush_caches() -> None:
    """Write 64 MiB (twice the L3 of this machine) so no operand starts in cache."""
    _scratch().add_(1)


def timed(fn, cold: bool = True) -> float:
    """Seconds ``fn()`` takes, starting with cold caches unless ``cold`` is False."""
    if cold:
        flush_caches()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(name, tensors, page_bytes, repeats, mode, rng, cold: bool) -> dict:
    """One state, page size, copier and cache setting; the three variants (public op,
    kernel without the op's input checks, raw copy) take turns inside every repeat."""
    from ditmem.ops import cpu as cpu_backend  # the C++ kernel behind the public op

    nbytes = sum(x.numel() * x.element_size() for x, _ in tensors.values())
    pages_needed = state_pages(tensors, page_bytes) + 2 * len(tensors)
    pool = PagePool(pages_needed, page_bytes)
    host = HostPool(pages_needed, page_bytes)
    eng = OffloadEngine(pool, host, mode=mode)
    eng_kernel = OffloadEngine(pool, host, mode=mode, copy_fn=cpu_backend.copy_blocks)
    state = RequestState(pool, name)
    for key, (x, row_ndim) in tensors.items():
        assert state.put(key, x, row_ndim=row_ndim) is not None
    raw_src = torch.zeros(nbytes, dtype=torch.uint8)
    raw_dst = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=host.is_pinned)

    def round_trip(engine) -> float:
        t = timed(lambda: state.offload(engine), cold)
        shuffle_free_pages(pool, rng)  # restore lands in scattered pages; not timed
        return t + timed(lambda: state.restore(engine), cold)

    ours, kern, raw = [], [], []
    for i in range(repeats + 1):  # the first repeat warms up
        t_ours = round_trip(eng)
        t_kern = round_trip(eng_kernel)
        t_raw = timed(lambda: raw_dst.copy_(raw_src), cold) + timed(
            lambda: raw_src.copy_(raw_dst), cold)
        if i:
            ours.append(t_ours)
            kern.append(t_kern)
            raw.append(t_raw)
    for key, (x, _) in tensors.items():  # bit-exact after all the round trips
        assert torch.equal(state.get(key).view(torch.uint8), x.view(torch.uint8)), key
    page_total = state.num_pages * page_bytes
    eng.close()
    eng_kernel.close()
    med = statistics.median
    return {"state": name, "cache": "cold" if cold else "warm", "mode": eng.mode,
            "page_kib": page_bytes >> 10, "data_mb": nbytes / 1e6, "page_mb": page_total / 1e6,
            "ours_ms": med(ours) * 1e3, "raw_copy_ms": med(raw) * 1e3,
            "ours_gb_s": 2 * nbytes / med(ours) / 1e9, "raw_gb_s": 2 * nbytes / med(raw) / 1e9,
            "ratio": med(r / o for r, o in zip(raw, ours, strict=True)),
            "ratio_kernel": med(r / k for r, k in zip(raw, kern, strict=True))}


def measure_overlap(tensors, page_bytes, repeats, rng) -> dict:
    """CPU worker-thread copier: offload+restore launched around a matmul loop."""
    nbytes = sum(x.numel() * x.element_size() for x, _ in tensors.values())
    n = state_pages(tensors, page_bytes) + 8
    pool, host = PagePool(n, page_bytes), HostPool(n, page_bytes)
    eng = OffloadEngine(pool, host, mode="thread")
    state = RequestState(pool)
    for key, (x, row_ndim) in tensors.items():
        state.put(key, x, row_ndim=row_ndim)
    a = torch.randn(384, 384)

    def compute():  # about as long as one direction of the transfer on this machine
        for _ in range(iters):
            a @ a

    def transfer():
        state.offload(eng)
        state.restore(eng)

    one = min(timed(lambda: a @ a, cold=False) for _ in range(20))
    iters = max(1, round(min(timed(transfer, cold=False) for _ in range(3)) / 2 / one))

    def both():
        h = state.start_offload(eng)
        compute()
        eng.finish_offload(h)
        h = state.start_restore(eng)
        compute()
        eng.finish_restore(h)

    t_c, t_t, t_b, hidden = [], [], [], []
    for i in range(repeats + 1):
        c, t, b = (timed(fn, cold=False) for fn in (compute, transfer, both))
        if i:
            t_c.append(c)
            t_t.append(t)
            t_b.append(b)
            hidden.append((2 * c + t - b) / t)  # share of the transfer hidden by compute
    c, t, b = (statistics.median(x) for x in (t_c, t_t, t_b))
    hidden = statistics.median(hidden)
    eng.close()
    return {"state": "overlap (thread)", "data_mb": nbytes / 1e6, "compute_ms": 2 * c * 1e3,
            "transfer_ms": t * 1e3, "both_ms": b * 1e3, "hidden_share": hidden}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small Wan state, fewer repeats")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    ap.add_argument("--page-kib", default=None, help="page sizes in KiB, comma separated")
    ap.add_argument("--wan-layers", type=int, default=None, help="Wan layers kept (of 40)")
    ap.add_argument("--modes", default="sync", help="copier modes: sync,thread")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--cache", default="cold,warm", help="cold,warm or one of them")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1 keeps a shared 2-core machine steady)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    pages = [int(p) for p in (args.page_kib or ("256,1024" if args.quick else
                                                 "64,256,1024")).split(",")]
    layers = args.wan_layers or (2 if args.quick else 8)
    repeats = args.repeats or (5 if args.quick else 15)
    g = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    states = {"qwen-1024": qwen_state_tensors(g), f"wan-720p/{layers}L":
              wan_state_tensors(g, layers)}
    rows = []
    for name, tensors in states.items():
        for kib in pages:
            for mode in args.modes.split(","):
                for cache in args.cache.split(","):
                    rows.append(measure(name, tensors, kib << 10, repeats, mode, rng,
                                        cold=cache == "cold"))
    print(f"offload + restore (shuffled pool) vs raw copy_ of the same bytes, median of "
          f"{repeats}; torch threads {torch.get_num_threads()}")
    print_table(rows, ["state", "cache", "mode", "page_kib", "data_mb", "page_mb", "ours_ms",
                       "raw_copy_ms", "ours_gb_s", "raw_gb_s", "ratio", "ratio_kernel"])
    ov = measure_overlap(states[f"wan-720p/{layers}L"], 256 << 10, repeats, rng)
    print()
    print_table([ov], ["state", "data_mb", "compute_ms", "transfer_ms", "both_ms",
                       "hidden_share"])
    write_json(args.json, "memory.offload", args, rows + [ov])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
