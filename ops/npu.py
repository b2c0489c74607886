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


def paged_attention(q, k_cache, v_cache, cu_seqlens_q, block_table, kv_lens, *, scale,
                    host=None):
    """See ditmem.ops.paged_attention (inputs validated). Raises ValueError for what the
    NPU kernel cannot take (float32, block_size not a multiple of 16). The kernel takes the
    lengths as host lists: from ``host`` (a HostIndex) when given, else read here."""
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
    if host is None:
        q_ends = cu_seqlens_q[1:].to(torch.int64).cpu().tolist()
        kv_list = kv_lens.to(torch.int64).cpu().tolist()
    else:
        q_ends, kv_list = list(host.q_ends), list(host.kv_lens)
    kwargs = {
        "input_layout": "TND",
        "num_heads": q.shape[1],
        "num_key_value_heads": kv_heads,
        "actual_seq_lengths": q_ends,
        "actual_seq_lengths_kv": kv_list,
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
    start = 0
    for end, n in zip(q_ends, kv_list, strict=True):  # the contract says zeros for no keys
        if n == 0 and end > start:
            out[start:end] = 0
        start = end
    return out
