"""paged_attention (cpu backend, shuffled pages) vs torch SDPA per request on contiguous K/V.

Scenarios: DiT-like requests of mixed lengths (1k-4k tokens), and a batch of many small
requests. Ratio = SDPA time / paged time (> 1: paged is faster); target >= 0.90.

    .venv/bin/python benchmarks/ops/bench_paged_attention.py [--quick] [--json PATH]
"""

from __future__ import annotations

import torch
from common import (
    attention_flops,
    make_batch,
    parser,
    report,
    sdpa_per_request,
    side_by_side,
)

import ditmem.ops as ops


def scenarios(quick: bool):
    mixed = [1024, 1536, 2560, 4096] if not quick else [512, 1024, 1536]
    small = [64, 96, 128, 200, 256] * (8 if not quick else 4)
    heads = 4 if not quick else 2
    return [
        ("mixed 1k-4k", mixed, heads, heads, 128, 128),
        ("mixed 1k-4k GQA 2:1", mixed, heads, heads // 2 or 1, 128, 128),
        ("many small", small, 8, 8, 64, 64),
        ("many small, block 16", small, 8, 8, 64, 16),
    ]


def run(quick: bool, repeats: int | None, dtypes) -> list[dict]:
    rows = []
    reps = repeats or (3 if quick else 5)
    for name, lens, heads, kv_heads, dim, bs in scenarios(quick):
        for dtype in dtypes:
            b = make_batch(lens, lens, heads, kv_heads, dim, bs, dtype)

            def paged(b=b):
                return ops.paged_attention(b.q, b.k_cache, b.v_cache, b.cu_seqlens_q,
                                           b.block_table, b.kv_lens)

            with ops.use_backend("cpu"):
                t = side_by_side({"paged": paged, "sdpa": lambda b=b: sdpa_per_request(b)}, reps)
            flops = attention_flops(lens, lens, heads, dim)
            rows.append({
                "scenario": name, "dtype": str(dtype).removeprefix("torch."),
                "requests": len(lens), "heads": f"{heads}/{kv_heads}x{dim}", "block": bs,
                "paged_ms": 1e3 * t["paged"], "sdpa_ms": 1e3 * t["sdpa"],
                "paged_gflops": flops / t["paged"] / 1e9,
                "ratio": t["sdpa"] / t["paged"],
            })
    return rows


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args()
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    rows = run(args.quick, args.repeats, dtypes)
    report("paged_attention cpu vs SDPA per request (ratio = sdpa/paged)", rows, args.json)


if __name__ == "__main__":
    main()
