"""GPU benchmark (CUDA): the Triton paged_attention kernel with shuffled pages vs the same
kernel on contiguous pages vs torch SDPA per request vs torch varlen attention (one call
for the ragged batch, where this torch has it), DiT-like shapes, triton.testing.do_bench.
Checks every output against per-request SDPA before timing. Runs in well under 2 minutes.

    python benchmarks/ops/bench_gpu.py [--quick] [--json PATH] [--dtype bfloat16]
    TRITON_INTERPRET=1 python benchmarks/ops/bench_gpu.py --dry-run   # CPU: checks only
"""

from __future__ import annotations

import sys

import torch
from common import make_batch, parser, report

import ditmem.ops as ops


def contiguous_table(batch):
    """Same requests with each request's blocks consecutive (block_table = ranges)."""
    k = torch.empty_like(batch.k_cache)
    v = torch.empty_like(batch.v_cache)
    table = torch.zeros_like(batch.block_table)
    nxt = 0
    for b in range(table.shape[0]):
        nb = int(-(-int(batch.kv_lens[b]) // batch.k_cache.shape[1]))
        ids = batch.block_table[b, :nb].long()
        k[nxt : nxt + nb] = batch.k_cache[ids]
        v[nxt : nxt + nb] = batch.v_cache[ids]
        table[b, :nb] = torch.arange(nxt, nxt + nb, dtype=table.dtype)
        nxt += nb
    return k, v, table


def sdpa_per_request(q, k_dense, v_dense, cu):
    outs = []
    for b in range(len(k_dense)):
        qb = q[cu[b] : cu[b + 1]].transpose(0, 1).unsqueeze(0)
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            qb, k_dense[b], v_dense[b], enable_gqa=qb.shape[1] != k_dense[b].shape[1]))
    return outs


def varlen_fn(q, k_dense, v_dense, cu_t, max_len):
    """torch.nn.attention.varlen.varlen_attn on packed K/V, or None if this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    k = torch.cat([x[0].transpose(0, 1) for x in k_dense])
    v = torch.cat([x[0].transpose(0, 1) for x in v_dense])
    fn = lambda: varlen_attn(q, k, v, cu_t, cu_t, max_len, max_len)  # noqa: E731
    try:
        fn()
    except Exception as exc:  # a baseline this torch/GPU cannot run is left out, said so
        print(f"varlen_attn unavailable here: {exc!r}", file=sys.stderr)
        return None
    return fn


def bench_case(name, lens, heads, kv_heads, dim, bs, dtype, device, dry_run) -> dict:
    cpu = make_batch(lens, lens, heads, kv_heads, dim, bs, dtype)
    q, kc, vc = cpu.q.to(device), cpu.k_cache.to(device), cpu.v_cache.to(device)
    cu_t, table = cpu.cu_seqlens_q.to(device), cpu.block_table.to(device)
    kv_lens = cpu.kv_lens.to(device)
    k_dense = [x.to(device) for x in cpu.k_dense]
    v_dense = [x.to(device) for x in cpu.v_dense]
    ck, cv, ctable = (x.to(device) for x in contiguous_table(cpu))
    cu = cpu.cu_seqlens_q.tolist()
    fns = {
        "paged": lambda: ops.paged_attention(q, kc, vc, cu_t, table, kv_lens),
        "contiguous": lambda: ops.paged_attention(q, ck, cv, cu_t, ctable, kv_lens),
    }
    varlen = None if dry_run else varlen_fn(q, k_dense, v_dense, cu_t, max(lens))
    if varlen is not None:
        fns["varlen"] = varlen
    ref = torch.cat([o[0].transpose(0, 1) for o in sdpa_per_request(q, k_dense, v_dense, cu)])
    for fn in fns.values():  # every contender must compute the same attention
        torch.testing.assert_close(fn().float(), ref.float(), atol=2e-2, rtol=2e-2)
    if dry_run:
        return {"case": name, "checked": "ok"}
    fns["sdpa_per_request"] = lambda: sdpa_per_request(q, k_dense, v_dense, cu)
    from triton.testing import do_bench

    ms = {n: do_bench(fn, warmup=25, rep=100) for n, fn in fns.items()}
    flops = sum(4.0 * n * n * heads * dim for n in lens)
    row = {"case": name, "dtype": str(dtype).removeprefix("torch.")}
    row.update({f"{n}_ms": t for n, t in ms.items()})
    row["paged_tflops"] = flops / ms["paged"] / 1e9
    row["paged_vs_contiguous"] = ms["contiguous"] / ms["paged"]
    row["paged_vs_sdpa"] = ms["sdpa_per_request"] / ms["paged"]
    if "varlen" in ms:
        row["paged_vs_varlen"] = ms["varlen"] / ms["paged"]
    return row


def run(quick: bool, dtype, device: str, dry_run: bool) -> list[dict]:
    if dry_run:
        cases = [("tiny", [5, 19, 33], 2, 2, 16, 16)]
    elif quick:
        cases = [("mixed 1k-4k", [1024, 2304, 4096], 24, 24, 128, 128)]
    else:
        cases = [(f"mixed 1k-4k, page {bs}", [1024, 1600, 2304, 3600, 4096], 24, 24, 128, bs)
                 for bs in (64, 128, 256)]
        cases.append(("many small, page 128", [256, 320, 512] * 16, 24, 24, 128, 128))
    with ops.use_backend("triton"):
        return [bench_case(*case, dtype, device, dry_run) for case in cases]


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes, correctness only (CPU + TRITON_INTERPRET=1)")
    args = p.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        print("bench_gpu.py needs a CUDA device (or --dry-run with TRITON_INTERPRET=1)")
        return 2
    dtype = torch.float32 if args.dry_run else getattr(torch, args.dtype)
    device = "cpu" if args.dry_run else "cuda"
    report("triton paged attention on GPU (ratios > 1: paged is faster)",
           run(args.quick, dtype, device, args.dry_run), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
