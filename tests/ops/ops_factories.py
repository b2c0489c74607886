"""Factories for the ops tests: ragged paged batches built with plain indexing, and the
independent reference: torch SDPA run per request on contiguous K/V."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class Case:
    q: torch.Tensor  # [total_q, H, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, H_kv, D]
    v_cache: torch.Tensor
    cu_seqlens_q: torch.Tensor  # int32 [B+1]
    block_table: torch.Tensor  # int32 [B, max_blocks]
    kv_lens: torch.Tensor  # int32 [B]
    k_dense: list[torch.Tensor]  # per request [L_b, H_kv, D]
    v_dense: list[torch.Tensor]

    def args(self):
        return (self.q, self.k_cache, self.v_cache, self.cu_seqlens_q, self.block_table,
                self.kv_lens)


def make_case(q_lens, kv_lens, heads=4, kv_heads=2, dim=16, block_size=8,
              dtype=torch.float32, seed=0, spare_blocks=3, pad_value=0) -> Case:
    """A batch whose requests' pages are a shuffled subset of the pool; unused table
    entries hold pad_value (ignored by the ops)."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in kv_lens]
    num_blocks = sum(need) + spare_blocks
    perm = torch.randperm(num_blocks, generator=g)
    width = max([*need, 0]) + 1
    table = torch.full((len(kv_lens), width), pad_value, dtype=torch.int32)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g).to(dtype)
    k_dense, v_dense, used = [], [], 0
    for b, n in enumerate(kv_lens):
        k = torch.randn(n, kv_heads, dim, generator=g).to(dtype)
        v = torch.randn(n, kv_heads, dim, generator=g).to(dtype)
        for j in range(need[b]):
            blk = int(perm[used + j])
            table[b, j] = blk
            rows = slice(j * block_size, min(n, (j + 1) * block_size))
            k_cache[blk, : rows.stop - rows.start] = k[rows]
            v_cache[blk, : rows.stop - rows.start] = v[rows]
        used += need[b]
        k_dense.append(k)
        v_dense.append(v)
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(list(q_lens), dtype=torch.int64).cumsum(0)
    q = torch.randn(int(cu[-1]), heads, dim, generator=g).to(dtype)
    return Case(q, k_cache, v_cache, cu, table, torch.tensor(list(kv_lens), dtype=torch.int32),
                k_dense, v_dense)


def sdpa_reference(case: Case, scale: float | None = None) -> torch.Tensor:
    """Per-request torch SDPA in float32 on contiguous K/V; zeros for requests without keys."""
    out = torch.zeros(case.q.shape, dtype=torch.float32)
    cu = case.cu_seqlens_q.tolist()
    gqa = case.q.shape[1] != case.k_cache.shape[2]
    for b, (k, v) in enumerate(zip(case.k_dense, case.v_dense, strict=True)):
        if cu[b + 1] == cu[b] or k.shape[0] == 0:
            continue
        qb = case.q[cu[b] : cu[b + 1]].float().transpose(0, 1)
        ob = F.scaled_dot_product_attention(
            qb, k.float().transpose(0, 1), v.float().transpose(0, 1), scale=scale,
            enable_gqa=gqa)
        out[cu[b] : cu[b + 1]] = ob.transpose(0, 1)
    return out


TOLERANCE = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=3e-3, rtol=3e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def device_for(backend: str) -> torch.device:
    """Where a backend's test tensors live: CUDA for triton when a GPU is present (the
    interpreter takes CPU tensors otherwise), the CPU for the others."""
    if backend == "triton" and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def on_device(case: Case, device) -> Case:
    """``case`` with its kernel inputs on ``device`` (the dense reference stays on the CPU)."""
    moved = [t.to(device) for t in case.args()]
    return Case(*moved, case.k_dense, case.v_dense)
