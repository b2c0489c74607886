"""Sequence-parallel packed step of Wan (self-attention over video tokens, cross-attention
over text K/V read by heads).

:func:`shard_batch` turns a prepared ``wan_packed.PackedBatch`` into this rank's part:
its token shard of every request (:mod:`ditmem.parallel.shards`) with the matching RoPE
rows and modulation segments, the packed layout of the whole batch (what attention sees
after the exchange) and a :class:`HeadExchange`. The adapter's ``run_blocks`` runs it
unchanged; in ``attn1`` Q/K/V go to the rank's heads over all tokens and back, in
``attn2`` the queries do and the text K/V (cached pages or packed text) are read for the
rank's heads only. :func:`forward_shard` gathers the rows at the end, because Wan's
unpatchify needs every token of a request.

Not covered: a chunked (block-boundary) Wan step at degree > 1 (``PackedBatch.boundary``
splits by the whole layout).
"""

from __future__ import annotations

import torch

from ditmem.models.packing import pad_to_min
from ditmem.models.wan_attention import PackedAttention, RopeTable
from ditmem.models.wan_packed import PackedBatch
from ditmem.parallel.exchange import HeadExchange
from ditmem.parallel.shards import shard


@torch.no_grad()
def shard_batch(batch: PackedBatch, group, rank: int, degree: int,
                num_heads: int) -> PackedBatch:
    """This rank's part of a prepared batch (see module docstring); the hidden rows are
    its shard ``[1, max(n, 16), dim]`` (zero padding after its n real rows)."""
    lens = batch.layout.lengths
    rows, segments, first, done = [], [], 0, 0
    for (_tokens, cond), n in zip(batch.segments, lens, strict=True):
        lo, hi = shard(n, degree, rank)
        rows.extend(range(first + lo, first + hi))
        if cond.stop - cond.start != 1:  # per-token conditioning rows follow the tokens
            cond = slice(cond.start + lo, cond.start + hi)
        segments.append((slice(done, done + hi - lo), cond))
        first, done = first + n, done + hi - lo
    index = torch.tensor(rows, dtype=torch.int64, device=batch.hidden.device)
    hidden = pad_to_min(batch.hidden[0].index_select(0, index)).unsqueeze(0)
    src = batch.attention
    rope = RopeTable(src.rope.cos.index_select(0, index.to(src.rope.cos.device)),
                     src.rope.sin.index_select(0, index.to(src.rope.sin.device)))
    exchange = HeadExchange.build(group, rank, degree, [lens], num_heads, hidden.device)
    attention = PackedAttention(src.layout, rope, src.text, src.text_layout, src.cached,
                                exchange)
    return PackedBatch(hidden, batch.layout, batch.grids, batch.temb, batch.proj, segments,
                       attention, batch.blocks_done)


@torch.no_grad()
def forward_shard(adapter, requests: list[dict], group, rank: int,
                  degree: int) -> list[torch.Tensor]:
    """``adapter.forward_packed(requests)`` at sequence-parallel degree ``degree``: every
    rank computes its token shard through the blocks; the rows are gathered for the
    output projection and unpatchify. Returns every request's ``[1, C, F, H, W]`` on every
    rank."""
    full = adapter.prepare(requests)
    heads = adapter.model.config.num_attention_heads
    local = shard_batch(full, group, rank, degree, heads)
    adapter.run_blocks(local, 0, adapter.num_blocks)
    ex = local.attention.exchange
    rows = ex.gather(local.hidden[0, : ex.local_rows[0]])
    full.hidden = pad_to_min(rows).unsqueeze(0)
    full.blocks_done = local.blocks_done
    return adapter.finish(full)
