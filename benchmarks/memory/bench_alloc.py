"""Allocate/free cost per page of PagePool at 10^4..10^5 pages, against a scanning allocator.

    python benchmarks/memory/bench_alloc.py [--quick] [--json PATH]

Each measurement allocates ``batch`` pages and frees them again, in a pool that is already
half full with pages freed in random order (a fragmented pool). The baseline finds free
pages by scanning a free mask (``nonzero``), which costs O(pool size) per allocation.
Reported: microseconds per page (allocate + free), median of several repeats.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, write_json  # noqa: E402

from ditmem.memory import PagePool  # noqa: E402


class ScanAllocator:
    """Baseline: a boolean free mask scanned for the first ``n`` free pages."""

    def __init__(self, num_pages: int) -> None:
        self.free_mask = torch.ones(num_pages, dtype=torch.bool)

    def allocate(self, n: int):
        idx = self.free_mask.nonzero().flatten()[:n]
        if idx.numel() < n:
            return None
        self.free_mask[idx] = False
        return idx

    def free(self, idx) -> None:
        self.free_mask[idx] = True


def fragment(pool: PagePool, num_pages: int, rng: random.Random) -> None:
    """Fill the pool, then free a random half (pages stay held by the rest)."""
    held = pool.allocate(num_pages)
    rng.shuffle(held)
    pool.free(held[: num_pages // 2])


def fragment_scan(scan: ScanAllocator, num_pages: int, rng: random.Random) -> None:
    """The same fragmentation for the baseline: a random half of the pages is free."""
    held = list(range(num_pages))
    rng.shuffle(held)
    scan.free_mask[held[num_pages // 2 :]] = False


def per_page_us(alloc, batch: int, iters: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            alloc.free(alloc.allocate(batch))
        samples.append((time.perf_counter() - t0) / (iters * batch) * 1e6)
    samples.sort()
    return samples[len(samples) // 2]


def tensor_us(pool: PagePool, rows: int, iters: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            pool.allocate_tensor(rows, (), torch.float32).free()  # 64-byte pages: 16 rows
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    samples.sort()
    return samples[len(samples) // 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    sizes = [10_000, 100_000] if args.quick else [10_000, 30_000, 100_000]
    batches = [1, 64] if args.quick else [1, 16, 256]
    repeats = 3 if args.quick else 7
    rng = random.Random(0)
    rows = []
    for num_pages in sizes:
        pool = PagePool(num_pages, page_bytes=64)
        fragment(pool, num_pages, rng)
        scan = ScanAllocator(num_pages)
        fragment_scan(scan, num_pages, rng)
        for batch in batches:
            iters = max(20, 20_000 // batch) if not args.quick else max(10, 5_000 // batch)
            ours = per_page_us(pool, batch, iters, repeats)
            base = per_page_us(scan, batch, max(5, iters // 20), repeats)
            rows.append({"pages": num_pages, "batch": batch, "pagepool_us_per_page": ours,
                         "scan_us_per_page": base, "speedup": base / ours})
        rows[-1]["tensor_alloc_free_us (256 pages)"] = tensor_us(
            pool, 256 * 16, 200 if args.quick else 1000, repeats)
    print("allocate+free cost per page, pool half full and fragmented (median of "
          f"{repeats})")
    print_table(rows, ["pages", "batch", "pagepool_us_per_page", "scan_us_per_page", "speedup",
                       "tensor_alloc_free_us (256 pages)"])
    write_json(args.json, "memory.alloc", args, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
