"""Launch the Triton paged-attention kernel; torch.library custom op with a fake kernel.

Tiles: on a GPU the kernel is autotuned per (head dim, page size, GQA group, dtype) over
:data:`GPU_CONFIGS` (BLOCK_M queries x BLOCK_N keys, warps, pipeline stages), pruned by
:func:`prune_configs` to the tiles that fit that head dim and dtype; bf16/fp16 inputs go
through ``tl.dot`` on tensor cores with fp32 accumulation, fp32 inputs use exact fp32 dots.
Under the interpreter (CPU tensors) one small fixed tile runs, with fp32 math.
``DITMEM_TRITON_AUTOTUNE=0`` skips the search on a GPU and runs :data:`FIXED_TILE` (the
test suite does: it checks numerics over many shapes, each of which would be tuned).
Index tensors (cu_seqlens, block_table, kv_lens) are normalised to contiguous int32 (a
strided view costs one small copy; the kernel assumes unit strides).
"""

from __future__ import annotations

import functools
import math
import os

import torch

#: (BLOCK_M, BLOCK_N, num_warps, num_stages) tried by the GPU autotuner
GPU_CONFIGS = (
    (128, 64, 8, 3),
    (128, 32, 4, 3),
    (64, 64, 4, 3),
    (64, 32, 4, 2),
    (128, 128, 8, 2),
    (32, 32, 4, 2),
)
#: the interpreter's fixed tile (it is slow: small tiles waste fewer rows)
INTERPRETER_TILE = (16, 16)
#: (BLOCK_M, BLOCK_N, num_warps, num_stages) on a GPU with DITMEM_TRITON_AUTOTUNE=0
FIXED_TILE = (64, 32, 4, 2)


def _autotune() -> bool:
    return os.environ.get("DITMEM_TRITON_AUTOTUNE", "1") != "0"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def prune_configs(configs, named_args, **kwargs):
    """Drop tiles that cannot pay off or do not fit for this call's head dim and dtype:
    head dims > 128 take at most 64 x 64 tiles, fp32 (no tensor cores, 2x the shared
    memory) at most 64-wide key tiles; always keeps at least the smallest tile."""
    args = {**named_args, **kwargs}
    block_d, fp32 = args["BLOCK_D"], args["DOT_FP32"]
    keep = []
    for c in configs:
        m, n = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
        if block_d > 128 and (m > 64 or n > 64):
            continue
        if fp32 and n > 64:
            continue
        keep.append(c)
    return keep or [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]


@functools.cache
def _kernel():
    """The kernel: autotuned on a GPU, the plain JIT function under the interpreter."""
    import triton

    from ditmem.ops.triton.kernel import paged_attention_fwd

    if _interpreting() or not _autotune():
        return paged_attention_fwd
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
               for m, n, w, s in GPU_CONFIGS]
    return triton.autotune(configs, key=["HEAD_DIM", "PAGE", "GROUP", "DOT_FP32"],
                           prune_configs_by={"early_config_prune": prune_configs})(
        paged_attention_fwd)


def _index(t: torch.Tensor) -> torch.Tensor:
    """int32, contiguous (a no-op for tensors that already are)."""
    return t.to(torch.int32).contiguous()


@torch.library.custom_op("ditmem_triton::paged_attention", mutates_args=())
def _paged_attention_op(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    block_table: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float,
    max_q_len: int,
) -> torch.Tensor:
    q = q.contiguous() if q.stride(2) != 1 else q
    out = torch.empty_like(q)
    total, heads, dim = q.shape
    batch = kv_lens.shape[0]
    if total == 0 or batch == 0 or max_q_len == 0:
        return out.zero_()
    cu, table, lens = _index(cu_seqlens_q), _index(block_table), _index(kv_lens)
    kernel = _kernel()
    args = (
        q, k_cache, v_cache, out, cu, table, lens,
        scale * math.log2(math.e), heads,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        table.stride(0),
    )
    meta = dict(GROUP=heads // k_cache.shape[2], PAGE=k_cache.shape[1], HEAD_DIM=dim,
                BLOCK_D=max(16, 1 << (dim - 1).bit_length()))
    if _interpreting():
        block_m, block_n = INTERPRETER_TILE
        grid = (triton_cdiv(max_q_len, block_m), batch * heads)
        kernel[grid](*args, **meta, BLOCK_M=block_m, BLOCK_N=block_n, DOT_FP32=True)
    elif not _autotune():
        block_m, block_n, warps, stages = FIXED_TILE
        grid = (triton_cdiv(max_q_len, block_m), batch * heads)
        kernel[grid](*args, **meta, BLOCK_M=block_m, BLOCK_N=block_n,
                     DOT_FP32=q.dtype == torch.float32, num_warps=warps, num_stages=stages)
    else:
        def grid(config):
            return (triton_cdiv(max_q_len, config["BLOCK_M"]), batch * heads)

        kernel[grid](*args, **meta, DOT_FP32=q.dtype == torch.float32)
    return out


@_paged_attention_op.register_fake
def _(q, k_cache, v_cache, cu_seqlens_q, block_table, kv_lens, scale, max_q_len):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def paged_attention(q, k_cache, v_cache, cu_seqlens_q, block_table, kv_lens, *, scale,
                    host=None):
    """See ditmem.ops.paged_attention (inputs validated). K/V must have unit stride in the
    head dim. ``host`` (a validated :class:`ditmem.ops.plan.HostIndex`) gives max(q_len)
    without a device read; without it, max(q_len) is read from cu_seqlens_q (one sync)."""
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError(
            f"k_cache/v_cache (strides {k_cache.stride()}, {v_cache.stride()}) need a "
            "contiguous head_dim for the triton backend"
        )
    if host is not None:
        max_q = host.max_q_len
    else:
        lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
        max_q = int(lens.max()) if lens.numel() else 0
    return _paged_attention_op(q, k_cache, v_cache, cu_seqlens_q, block_table, kv_lens,
                               float(scale), max_q)
