"""The public ops: validate the inputs, pick a backend (ditmem.ops.backends), run it."""

from __future__ import annotations

import torch

from ditmem.ops import validation
from ditmem.ops.backends import backend_for, backend_module, select_backend
from ditmem.ops.plan import AttentionPlan


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    block_table: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Ragged, non-causal attention of B requests over K/V stored in blocks.

    q: [total_q, H, D] float32/float16/bfloat16, request b's queries are rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1]; k_cache/v_cache: [num_blocks, block_size, H_kv, D]
    with q's dtype (H a multiple of H_kv: GQA); cu_seqlens_q: int32 [B+1];
    block_table: int32 [B, max_blocks] (request b's keys are the first kv_lens[b] rows of
    blocks block_table[b, 0], block_table[b, 1], ... in order; later entries are ignored);
    kv_lens: int32 [B]. scale defaults to D**-0.5.
    Returns [total_q, H, D] in q's dtype; softmax in float32. A request with kv_lens[b] == 0
    yields zeros. Raises ValueError on malformed inputs.
    """
    host = validation.check_paged_attention(q, k_cache, v_cache, cu_seqlens_q, block_table,
                                            kv_lens, scale)
    scale = q.shape[2] ** -0.5 if scale is None else float(scale)
    impl = backend_module(backend_for(q))
    return impl.paged_attention(
        q, k_cache, v_cache, cu_seqlens_q, block_table, kv_lens, scale=scale, host=host
    )


def planned_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: AttentionPlan,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """:func:`paged_attention` with the index tensors of a validated, uploaded
    :class:`~ditmem.ops.plan.AttentionPlan` (built once, reused by every layer): only
    metadata is checked here and nothing is read from the device.

    q: [plan.total_q, H, D]; k_cache/v_cache: [>= plan.min_blocks, plan.block_size, H_kv, D].
    Returns [total_q, H, D] in q's dtype. Raises ValueError on mismatched operands.
    """
    validation.check_planned_attention(q, k_cache, v_cache, plan, scale)
    scale = q.shape[2] ** -0.5 if scale is None else float(scale)
    impl = backend_module(backend_for(q))
    return impl.paged_attention(q, k_cache, v_cache, plan.cu_seqlens_q, plan.block_table,
                                plan.kv_lens, scale=scale, host=plan.host)


def write_blocks(x: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter rows into a block cache in place.

    x: [T, *row] (any device and dtype: copied to cache's); cache: [num_blocks, block_size,
    *row]; slot_mapping: int32/int64 [T] on cache's device, slot = block * block_size +
    offset, or -1 to skip that row.
    """
    validation.check_write_blocks(x, cache, slot_mapping)
    x = x.to(device=cache.device, dtype=cache.dtype)
    backend_module(backend_for(cache)).write_blocks(x, cache, slot_mapping)


def gather_blocks(
    cache: torch.Tensor, block_table: torch.Tensor, lens: torch.Tensor
) -> torch.Tensor:
    """Read each request's first lens[b] rows out of its blocks, packed in request order.

    cache: [num_blocks, block_size, *row]; block_table: int32 [B, max_blocks];
    lens: int32 [B]. Returns [sum(lens), *row] with cache's dtype and device.
    """
    total = validation.check_gather_blocks(cache, block_table, lens)
    return backend_module(backend_for(cache)).gather_blocks(cache, block_table, lens,
                                                            total=total)


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, mapping: torch.Tensor) -> None:
    """Copy whole blocks in place: dst[mapping[i, 1]] = src[mapping[i, 0]].

    src: [num_src_blocks, *block]; dst: [num_dst_blocks, *block] with src's block shape and
    dtype, on any device (host<->device copies are asynchronous when the host side is
    pinned: synchronize before reading dst); mapping: int64 [N, 2] (src block, dst block).
    The backend is chosen by dst's device, or src's when dst is on the CPU.
    """
    validation.check_copy_blocks(src, dst, mapping)
    device_type = dst.device.type
    if device_type == "cpu":
        device_type = src.device.type
    backend_module(select_backend(device_type)).copy_blocks(src, dst, mapping)
