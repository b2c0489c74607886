"""The ``npu`` backend (Ascend): paged attention through
``torch_npu.npu_fused_infer_attention_score`` with a block table; block copies in torch.

Argument mapping (torch_npu API reference, "npu_fused_infer_attention_score"):
query [T, H, D] with ``input_layout="TND"`` and ``actual_seq_lengths`` = cumulative query
ends (cu_seqlens_q[1:]); key/value = the caches viewed as [num_blocks, block_size, H_kv*D]
(zero-copy); ``block_table`` int32 [B, max_blocks]; ``actual_seq_lengths_kv`` = kv_lens;
``block_size`` (a multiple of 16; 128 recommended); ``num_heads``,
``num_key_value_heads``; ``scale`` (``scale_value`` in older torch_npu); ``sparse_mode=0``
and no mask (non-causal). The kernel takes float16/bfloat16 only. No NPU was available
while writing this: tests/ops/test_npu_contract.py checks the mapping against a fake
torch_npu, not the real kernel.
"""

from __future__ import annotations

import importlib

import torch

from ditmem.ops.torch_blocks import copy_blocks as copy_blocks  # the backend interface
from ditmem.ops.torch_blocks import gather_blocks as gather_blocks
from ditmem.ops.torch_blocks import write_blocks as write_blocks

NPU_DTYPES = (torch.float16, torch.bfloat16)


def _torch_npu():
    return importlib.import_module("torch_npu")


def _scale_keyword(torch_npu) -> str:
    """'scale' in current torch_npu, 'scale_value' in releases before 7.0."""
    op = getattr(getattr(torch.ops, "npu", None), "npu_fused_infer_attention_score", None)
    try:
        names = [a.name for a in op.default._schema.arguments]
    except AttributeError:
        return "scale"
    return "scale_value" if "scale_value" in names else "scale"


def paged_attention(q, k_cache, v_cache, cu_seqlens_q, block_table, kv_lens, *, scale):
    """See ditmem.ops.paged_attention (inputs validated). Raises ValueError for what the
    NPU kernel cannot take (float32, block_size not a multiple of 16)."""
    if q.dtype not in NPU_DTYPES:
        raise ValueError(
            f"q ({tuple(q.shape)}, {q.dtype}): the npu backend runs float16/bfloat16 only; "
            "cast, or use_backend('reference')"
        )
    num_blocks, block_size, kv_heads, dim = k_cache.shape
    if block_size % 16:
        raise ValueError(
            f"k_cache (shape {tuple(k_cache.shape)}): the npu kernel needs block_size % 16 == 0"
        )
    torch_npu = _torch_npu()
    cu = cu_seqlens_q.to(torch.int64).cpu()
    lens = kv_lens.to(torch.int64).cpu()
    kwargs = {
        "input_layout": "TND",
        "num_heads": q.shape[1],
        "num_key_value_heads": kv_heads,
        "actual_seq_lengths": cu[1:].tolist(),
        "actual_seq_lengths_kv": lens.tolist(),
        "block_table": block_table.to(torch.int32).contiguous(),
        "block_size": block_size,
        "sparse_mode": 0,
        _scale_keyword(torch_npu): float(scale),
    }
    out, _lse = torch_npu.npu_fused_infer_attention_score(
        q.contiguous(),
        k_cache.reshape(num_blocks, block_size, kv_heads * dim),
        v_cache.reshape(num_blocks, block_size, kv_heads * dim),
        **kwargs,
    )
    out = out.reshape(q.shape)
    empty = lens == 0
    if bool(empty.any()):  # the contract says zeros; do not rely on the kernel for it
        rows = torch.repeat_interleave(empty, cu[1:] - cu[:-1])
        out[rows.to(out.device)] = 0
    return out
