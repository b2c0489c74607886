"""copy_blocks bandwidth (cpu backend, shuffled page mapping) vs one raw ``copy_`` of the
same bytes, pages of 64 KiB to 64 MiB. Ratio = copy_blocks GB/s / raw copy_ GB/s (target
>= 0.80), from the medians of interleaved repeats; ratio_best from the fastest repeat of each
(memory bandwidth is shared with whatever else runs: the best repeat is the least disturbed).

    .venv/bin/python benchmarks/ops/bench_copy_blocks.py [--quick] [--json PATH]
"""

from __future__ import annotations

import statistics

import torch
from common import parser, report, samples

import ditmem.ops as ops

KIB = 1024


def run(quick: bool, repeats: int | None) -> list[dict]:
    total = (32 if quick else 128) * KIB * KIB
    sizes = [64 * KIB, 256 * KIB, 1024 * KIB, 4096 * KIB, 16384 * KIB, 65536 * KIB]
    rows = []
    for page in sizes:
        pages = max(2, total // page)
        src = torch.randint(0, 255, (pages, page), dtype=torch.uint8)
        dst = torch.zeros_like(src)
        g = torch.Generator().manual_seed(page)
        mapping = torch.stack([torch.randperm(pages, generator=g),
                               torch.randperm(pages, generator=g)], 1)
        flat_src, flat_dst = src.view(-1), torch.zeros_like(src).view(-1)
        with ops.use_backend("cpu"):
            times = samples({
                "copy_blocks": lambda src=src, dst=dst, m=mapping: ops.copy_blocks(src, dst, m),
                "raw_copy": lambda s=flat_src, d=flat_dst: d.copy_(s),
            }, repeats or (5 if quick else 15))
        t = {k: statistics.median(v) for k, v in times.items()}
        best = {k: min(v) for k, v in times.items()}
        assert torch.equal(dst[mapping[:, 1]], src[mapping[:, 0]])
        nbytes = pages * page
        rows.append({"page_KiB": page // KIB, "pages": pages,
                     "copy_blocks_GBps": nbytes / t["copy_blocks"] / 1e9,
                     "raw_copy_GBps": nbytes / t["raw_copy"] / 1e9,
                     "ratio": t["raw_copy"] / t["copy_blocks"],
                     "ratio_best": best["raw_copy"] / best["copy_blocks"]})
        del src, dst, flat_dst
    return rows


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    report("copy_blocks vs raw copy_ of the same bytes (ratio = copy_blocks/raw bandwidth)",
           run(args.quick, args.repeats), args.json)


if __name__ == "__main__":
    main()
