"""Compile the Triton paged-attention kernel ahead of time for a GPU target (no GPU needed):
every autotune config the pruner keeps, per dtype and head dim, to a cubin for sm_90 (H100/
H200) and sm_80 (A100). Shows that the GPU configuration compiles and what shared memory
each tile takes (H100/H200: 227 KiB per block, A100: 163 KiB).

    .venv/bin/python benchmarks/ops/triton_aot.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)  # must be unset before triton is imported


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    p.add_argument("--archs", default="90,80")
    args = p.parse_args(argv)
    import triton
    from triton.backends.compiler import GPUTarget

    from ditmem.ops.triton.kernel import paged_attention_fwd
    from ditmem.ops.triton.launch import GPU_CONFIGS, prune_configs

    ptr = {"bfloat16": "*bf16", "float16": "*fp16", "float32": "*fp32"}
    rows, failed = [], 0
    for arch in [int(a) for a in args.archs.split(",")]:
        for dtype, head_dim in (("bfloat16", 128), ("float16", 128), ("float32", 128),
                                ("bfloat16", 64)):
            configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
                       for m, n, w, s in GPU_CONFIGS]
            fp32 = dtype == "float32"
            kept = prune_configs(configs, {}, BLOCK_D=head_dim, DOT_FP32=fp32)
            for c in kept:
                sig = {n: ptr[dtype] for n in ("Q", "K", "V", "Out")}
                sig.update({n: "*i32" for n in ("CU", "BT", "LENS")})
                sig.update(qk_scale="fp32", num_heads="i32")
                for n in ("stride_qt", "stride_qh", "stride_kb", "stride_ks", "stride_kh",
                          "stride_vb", "stride_vs", "stride_vh", "stride_ot", "stride_oh",
                          "stride_bt"):
                    sig[n] = "i64" if n.endswith("b") else "i32"
                consts = dict(GROUP=1, PAGE=64, HEAD_DIM=head_dim, BLOCK_D=head_dim,
                              DOT_FP32=fp32, **c.kwargs)
                sig.update({k: "constexpr" for k in consts})
                row = dict(arch=f"sm_{arch}", dtype=dtype, head_dim=head_dim, **c.kwargs,
                           num_warps=c.num_warps, num_stages=c.num_stages)
                try:
                    src = triton.compiler.ASTSource(fn=paged_attention_fwd, signature=sig,
                                                    constexprs=consts)
                    out = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                         options=dict(num_warps=c.num_warps,
                                                      num_stages=c.num_stages))
                    row.update(ok="cubin" in out.asm, shared_kib=out.metadata.shared / 1024)
                except Exception as exc:  # noqa: BLE001 - report every config
                    failed += 1
                    row.update(ok=False, error=repr(exc)[:200])
                rows.append(row)
                print(row, flush=True)
        from ditmem.ops.triton.blocks import BLOCK, _kernel

        copy_kernel = _kernel()
        for width in ("i64", "i16"):
            sig = {"SRC": f"*{width}", "DST": f"*{width}", "SRC_IDX": "*i64", "DST_IDX": "*i64",
                   "row_elems": "i32", "src_stride_b": "i64", "src_stride_s": "i64",
                   "dst_stride_b": "i64", "dst_stride_s": "i64"}
            consts = dict(SRC_BS=64, DST_BS=1, HAS_SRC_IDX=True, HAS_DST_IDX=True, BLOCK=BLOCK)
            sig.update({k: "constexpr" for k in consts})
            row = dict(arch=f"sm_{arch}", kernel="copy_rows", width=width)
            try:
                out = triton.compile(triton.compiler.ASTSource(
                    fn=copy_kernel, signature=sig, constexprs=consts),
                    target=GPUTarget("cuda", arch, 32), options=dict(num_warps=4))
                row.update(ok="cubin" in out.asm)
            except Exception as exc:  # noqa: BLE001
                failed += 1
                row.update(ok=False, error=repr(exc)[:200])
            rows.append(row)
            print(row, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
