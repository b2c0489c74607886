"""Block-size sweep: paged_attention (cpu backend, shuffled pages) with 16-256 rows per
block vs torch SDPA per request on contiguous K/V, same requests, side by side.

    .venv/bin/python benchmarks/ops/bench_block_size.py [--quick] [--json PATH]
"""

from __future__ import annotations

import torch
from common import make_batch, parser, report, sdpa_per_request, side_by_side

import ditmem.ops as ops

BLOCK_SIZES = (16, 32, 64, 128, 256)


def run(quick: bool, repeats: int | None, dtype) -> list[dict]:
    lens = [700, 1300, 2100] if not quick else [300, 700]
    heads, dim = (4, 128) if not quick else (2, 64)
    rows = []
    for bs in BLOCK_SIZES:
        b = make_batch(lens, lens, heads, heads, dim, bs, dtype, seed=bs)

        def paged(b=b):
            return ops.paged_attention(b.q, b.k_cache, b.v_cache, b.cu_seqlens_q,
                                       b.block_table, b.kv_lens)

        with ops.use_backend("cpu"):
            t = side_by_side({"paged": paged, "sdpa": lambda b=b: sdpa_per_request(b)},
                             repeats or (3 if quick else 5))
        rows.append({"block_size": bs, "dtype": str(dtype).removeprefix("torch."),
                     "paged_ms": 1e3 * t["paged"], "sdpa_ms": 1e3 * t["sdpa"],
                     "ratio": t["sdpa"] / t["paged"]})
    return rows


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--dtype", default="float32")
    args = p.parse_args()
    rows = run(args.quick, args.repeats, getattr(torch, args.dtype))
    report("block-size sweep, paged cpu vs SDPA per request (ratio = sdpa/paged)", rows,
           args.json)


if __name__ == "__main__":
    main()
