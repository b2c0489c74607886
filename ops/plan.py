"""Plan once, run per layer: the index tensors of a ragged paged-attention call, validated
on the host from Python lists and uploaded once (one host->device copy), so a model that
calls ``paged_attention`` in every layer reads nothing back from the device.

    plan = AttentionPlan.build(q_lens=[...], block_tables=[[...], ...], kv_lens=[...],
                               block_size=64, num_blocks=pool_blocks, device=q.device)
    out = ditmem.ops.planned_attention(q, k_cache, v_cache, plan)   # every layer

``HostIndex`` is the host-side summary a backend may need (max query length for the
Triton grid; the per-request lengths the NPU kernel takes as lists).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch


@dataclass(slots=True, frozen=True)
class HostIndex:
    """What a backend may need on the host, known without reading the device.

    q_ends: cumulative query ends (``cu_seqlens_q[1:]``); kv_lens: keys per request;
    max_q_len / max_kv_len: their maxima (0 for an empty batch)."""

    q_ends: tuple[int, ...]
    kv_lens: tuple[int, ...]
    max_q_len: int
    max_kv_len: int

    @staticmethod
    def from_lists(cu: list[int], kv_lens: list[int]) -> HostIndex:
        q_lens = [b - a for a, b in zip(cu, cu[1:], strict=False)]
        return HostIndex(tuple(cu[1:]), tuple(kv_lens), max(q_lens, default=0),
                         max(kv_lens, default=0))


@dataclass(slots=True, frozen=True)
class AttentionPlan:
    """Validated, uploaded index tensors of one attention call shape (reused by layers).

    cu_seqlens_q: int32 [B+1]; block_table: int32 [B, W]; kv_lens: int32 [B] (contiguous
    views of one device buffer); block_size: K/V rows per block; min_blocks: a K/V pool
    needs at least this many blocks (largest block id read + 1); total_q: query rows;
    host: the :class:`HostIndex`."""

    cu_seqlens_q: torch.Tensor
    block_table: torch.Tensor
    kv_lens: torch.Tensor
    block_size: int
    min_blocks: int
    total_q: int
    host: HostIndex

    @property
    def batch(self) -> int:
        return len(self.host.kv_lens)

    @staticmethod
    def build(*, q_lens: list[int], block_tables: list[list[int]], kv_lens: list[int],
              block_size: int, device, num_blocks: int | None = None) -> AttentionPlan:
        """Check and upload: request b has ``q_lens[b]`` query rows and its first
        ``kv_lens[b]`` keys in blocks ``block_tables[b]`` (rows may differ in length:
        padded with block 0, never read). ``num_blocks``: the pool's size, to check ids
        against now (otherwise :func:`ditmem.ops.planned_attention` checks ``min_blocks``
        against the pool it gets). ValueError naming the bad argument."""
        q_lens, kv_lens = [int(n) for n in q_lens], [int(n) for n in kv_lens]
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
        if not (len(q_lens) == len(kv_lens) == len(block_tables)):
            raise ValueError(f"q_lens/kv_lens/block_tables: {len(q_lens)}, {len(kv_lens)} and "
                             f"{len(block_tables)} requests")
        if any(n < 0 for n in q_lens):
            raise ValueError(f"q_lens: negative entry in {q_lens}")
        if any(n < 0 for n in kv_lens):
            raise ValueError(f"kv_lens: negative entry in {kv_lens}")
        width = max([1, *(len(r) for r in block_tables)])
        top = -1
        for b, (row, n) in enumerate(zip(block_tables, kv_lens, strict=True)):
            need = -(-n // block_size)
            if need > len(row):
                raise ValueError(f"kv_lens: request {b} has {n} keys, more than its "
                                 f"{len(row)} blocks of {block_size} rows hold")
            used = row[:need]
            if used and (min(used) < 0 or (num_blocks is not None and max(used) >= num_blocks)):
                raise ValueError(f"block_tables: request {b} reads block ids outside "
                                 f"[0, {num_blocks}): {used}")
            top = max(top, max(used, default=-1))
        cu = list(accumulate(q_lens, initial=0))
        batch = len(q_lens)
        flat = cu + [x for row in block_tables for x in (*row, *[0] * (width - len(row)))] \
            + kv_lens
        buf = torch.tensor(flat, dtype=torch.int32)
        device = torch.device(device)
        if device.type != "cpu":
            buf = buf.pin_memory().to(device, non_blocking=True)
        table_end = batch + 1 + batch * width
        return AttentionPlan(
            cu_seqlens_q=buf[: batch + 1],
            block_table=buf[batch + 1 : table_end].view(batch, width),
            kv_lens=buf[table_end:],
            block_size=block_size,
            min_blocks=top + 1,
            total_q=cu[-1],
            host=HostIndex.from_lists(cu, kv_lens),
        )
