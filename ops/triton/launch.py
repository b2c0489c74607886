"""Launch the Triton paged-attention kernel; torch.library custom op with a fake kernel."""

from __future__ import annotations

import math
import os

import torch

from ditmem.ops.torch_blocks import copy_blocks as copy_blocks  # the backend interface
from ditmem.ops.torch_blocks import gather_blocks as gather_blocks
from ditmem.ops.torch_blocks import write_blocks as write_blocks

BLOCK_M = 64
BLOCK_N = 64


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


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
    from ditmem.ops.triton.kernel import paged_attention_fwd

    q = q.contiguous() if q.stride(2) != 1 else q
    out = torch.empty_like(q)
    total, heads, dim = q.shape
    batch = kv_lens.shape[0]
    if total == 0 or batch == 0 or max_q_len == 0:
        return out.zero_()
    small = _interpreting()  # the interpreter is slow: smaller tiles, fewer wasted rows
    block_m = 16 if small else BLOCK_M
    block_n = 16 if small else BLOCK_N
    dot_fp32 = small or q.dtype == torch.float32
    grid = (triton_cdiv(max_q_len, block_m), batch * heads)
    paged_attention_fwd[grid](
        q, k_cache, v_cache, out, cu_seqlens_q, block_table, kv_lens,
        scale * math.log2(math.e), heads,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        block_table.stride(0),
        GROUP=heads // k_cache.shape[2],
        PAGE=k_cache.shape[1],
        HEAD_DIM=dim,
        BLOCK_D=max(16, 1 << (dim - 1).bit_length()),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOT_FP32=dot_fp32,
    )
    return out


@_paged_attention_op.register_fake
def _(q, k_cache, v_cache, cu_seqlens_q, block_table, kv_lens, scale, max_q_len):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def paged_attention(q, k_cache, v_cache, cu_seqlens_q, block_table, kv_lens, *, scale):
    """See ditmem.ops.paged_attention (inputs validated). K/V must have unit stride in the
    head dim. Reads max(q_len) from cu_seqlens_q once on the host (a small sync)."""
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError(
            f"k_cache/v_cache (strides {k_cache.stride()}, {v_cache.stride()}) need a "
            "contiguous head_dim for the triton backend"
        )
    lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    max_q = int(lens.max()) if lens.numel() else 0
    return _paged_attention_op(
        q, k_cache, v_cache, cu_seqlens_q.to(torch.int32), block_table.to(torch.int32),
        kv_lens.to(torch.int32), float(scale), max_q,
    )
