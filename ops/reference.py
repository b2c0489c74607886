"""Pure-torch reference implementations of the ditmem ops (every device, every dtype).

These are the semantics the other backends must match. They favour clarity over speed.
"""

from __future__ import annotations

import torch


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    block_table: torch.Tensor,
    kv_lens: torch.Tensor,
    scale: float | None = None,
    host=None,
) -> torch.Tensor:
    """Ragged, non-causal attention of B requests over K/V stored in blocks (``host`` is
    accepted for the backend interface and not needed).

    q: [total_q, H, D]; k_cache/v_cache: [num_blocks, block_size, H_kv, D];
    cu_seqlens_q: int32 [B+1]; block_table: int32 [B, max_blocks]; kv_lens: int32 [B].
    Returns [total_q, H, D] in q's dtype; math in float32. A request with no keys yields zeros.
    """
    total_q, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    out = torch.zeros_like(q)
    cu = cu_seqlens_q.tolist()
    lens = kv_lens.tolist()
    for b in range(len(lens)):
        q_b = q[cu[b] : cu[b + 1]]
        n = lens[b]
        if q_b.shape[0] == 0 or n == 0:
            continue
        k_b = gather_blocks(k_cache, block_table[b : b + 1], kv_lens[b : b + 1])
        v_b = gather_blocks(v_cache, block_table[b : b + 1], kv_lens[b : b + 1])
        k_b = k_b.float().repeat_interleave(group, dim=1)  # [n, H, D]
        v_b = v_b.float().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q_b.float(), k_b) * scale
        probs = torch.softmax(scores, dim=-1)
        out[cu[b] : cu[b + 1]] = torch.einsum("hqk,khd->qhd", probs, v_b).to(q.dtype)
    return out


def write_blocks(x: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter rows into a block cache in place.

    x: [T, *row]; cache: [num_blocks, block_size, *row]; slot_mapping: int64 [T] with
    slot = block * block_size + offset, or -1 to skip that row.
    """
    flat = cache.view(-1, *cache.shape[2:])
    keep = slot_mapping >= 0
    flat[slot_mapping[keep].long()] = x[keep.to(x.device)].to(cache.dtype)


def gather_blocks(
    cache: torch.Tensor, block_table: torch.Tensor, lens: torch.Tensor, *, total=None
) -> torch.Tensor:
    """Read each request's first lens[b] rows out of its blocks, packed.

    cache: [num_blocks, block_size, *row]; block_table: int32 [B, max_blocks];
    lens: int32 [B]. Returns [sum(lens), *row].
    """
    block_size = cache.shape[1]
    parts = []
    for b, n in enumerate(lens.tolist()):
        if n == 0:
            continue
        nblocks = -(-n // block_size)
        blocks = block_table[b, :nblocks].long().to(cache.device)
        parts.append(cache[blocks].reshape(-1, *cache.shape[2:])[:n])
    if not parts:
        return cache.new_empty((0, *cache.shape[2:]))
    return torch.cat(parts)


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, mapping: torch.Tensor) -> None:
    """Copy whole blocks: dst[mapping[i, 1]] = src[mapping[i, 0]] (devices may differ).

    src: [num_src_blocks, ...]; dst: [num_dst_blocks, ...] with the same block shape and
    dtype; mapping: int64 [N, 2].
    """
    for s, d in mapping.tolist():
        dst[d].copy_(src[s])
