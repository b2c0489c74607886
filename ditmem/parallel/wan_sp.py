"""Sequence-parallel packed step of Wan (self-attention over video tokens, cross-attention
over text K/V read by heads).

:func:`shard_batch` turns a prepared ``wan.packed.PackedBatch`` into this rank's part:
its token shard of every request (:mod:`ditmem.parallel.shards`) with the matching RoPE
rows and modulation segments, the packed layout of the whole batch (what attention sees
after the exchange) and a :class:`HeadExchange`. The adapter's ``run_blocks`` runs it
unchanged; in ``attn1`` Q/K/V go to the rank's heads over all tokens and back, in
``attn2`` the queries do and the text K/V (cached pages or packed text) are read for the
rank's heads only. :func:`forward_shard` gathers the rows at the end, because Wan's
unpatchify needs every token of a request.

:func:`sharded_step` is a whole denoising step of states held token-sharded
(:mod:`ditmem.parallel.token_rows`: latents and UniPC history as token rows): the latents'
rows are all-gathered (the patch embedding is a strided convolution over the whole
latents, run as the degree-1 step runs it), the blocks run on the rank's token shard, the
output norm and projection on its rows give its rows of the prediction in token-row layout
(no unpatchify), and guidance and the UniPC update — elementwise — run on those rows only.

Not covered: a chunked (block-boundary) Wan step at degree > 1 (``PackedBatch.boundary``
splits by the whole layout).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ditmem.models.common.generator import check_step_states
from ditmem.models.common.packing import pad_to_min
from ditmem.models.wan import state as ws
from ditmem.models.wan.attention import PackedAttention, RopeTable
from ditmem.models.wan.kv_cache import cached_text_kv
from ditmem.models.wan.packed import PackedBatch, _modulate_
from ditmem.models.wan.solver import unipc_step
from ditmem.parallel.exchange import HeadExchange
from ditmem.parallel.shards import bounds, shard
from ditmem.parallel.token_rows import SHAPES, rows_of


@torch.no_grad()
def shard_batch(batch: PackedBatch, group, rank: int, degree: int, num_heads: int,
                caches=None, model=None) -> PackedBatch:
    """This rank's part of a prepared batch (see module docstring); the hidden rows are
    its shard ``[1, max(n, 16), dim]`` (zero padding after its n real rows). ``caches``
    (the requests' ``WanCrossKV``, with ``model`` their transformer): the rank's text K/V
    are read from compacted copies of their blocks for its heads (what
    ``wan.kv_cache.cached_text_kv(..., heads=)`` gives) instead of the whole arena."""
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
    cached = src.cached
    if cached is not None and caches is not None:
        cached = cached_text_kv(model, caches, lens, heads=exchange.heads)
    attention = PackedAttention(src.layout, rope, src.text, src.text_layout, cached,
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
    local = shard_batch(full, group, rank, degree, heads, _caches(requests), adapter.model)
    adapter.run_blocks(local, 0, adapter.num_blocks)
    ex = local.attention.exchange
    rows = ex.gather(local.hidden[0, : ex.local_rows[0]])
    full.hidden = pad_to_min(rows).unsqueeze(0)
    full.blocks_done = local.blocks_done
    return adapter.finish(full)


def _caches(requests: list[dict]):
    """The requests' cached text K/V (``None`` when they carry packed text)."""
    return [kw["cross_kv"] for kw in requests] if "cross_kv" in requests[0] else None


def unembed_rows(model, batch: PackedBatch) -> list[torch.Tensor]:
    """Output norm and projection of a rank's part (:func:`shard_batch`) after all blocks:
    per request this rank's rows of the prediction in token-row layout ``[1, n_b, P]``
    (what ``wan.packed.unembed`` computes per token, before its unpatchify)."""
    shift, scale = (model.scale_shift_table[0] + batch.temb.unsqueeze(1)).unbind(1)
    hidden = batch.hidden
    normed = _modulate_(model.norm_out(hidden.float()), batch.segments, 1 + scale, shift)
    out = model.proj_out(normed.type_as(hidden))[0]
    return [out[tokens].unsqueeze(0) for tokens, _ in batch.segments]


def gather_rows(parts: list[torch.Tensor], lens: list[int], group, rank: int,
                degree: int) -> list[torch.Tensor]:
    """Every request's whole token rows ``[1, S_b, P]`` on every rank from each rank's
    rows ``parts[b] [1, n_b, P]`` (``n_b`` = its shard of ``lens[b]``): one all-gather of
    equal-size padded buffers; the row counts are python ints (no device reads)."""
    sizes = [[hi - lo for lo, hi in bounds(n, degree)] for n in lens]
    for b, (part, n) in enumerate(zip(parts, lens, strict=True)):
        if part.shape[1] != sizes[b][rank]:
            raise ValueError(f"gather_rows: request {b} holds {part.shape[1]} rows, rank "
                             f"{rank}'s shard of {n} is {sizes[b][rank]}")
    per_rank = [sum(s[r] for s in sizes) for r in range(degree)]
    width = parts[0].shape[2]
    padded = torch.zeros((max(per_rank), width), dtype=parts[0].dtype, device=parts[0].device)
    padded[: per_rank[rank]] = torch.cat([p[0] for p in parts])
    bufs = [torch.empty_like(padded) for _ in range(degree)]
    dist.all_gather(bufs, padded, group=group)
    pieces = [list(buf[: per_rank[r]].split([s[r] for s in sizes])) for r, buf in enumerate(bufs)]
    return [torch.cat([pieces[r][b] for r in range(degree)]).unsqueeze(0)
            for b in range(len(lens))]


@torch.no_grad()
def sharded_step(gen, states, group, rank: int, degree: int) -> None:
    """One whole step of Wan ``states`` (between steps, latents and solver history held
    as rank ``rank``'s token rows of ``degree``) on the process group ``group``; see the
    module docstring. The states' rows are updated in place (their pages)."""
    check_step_states(states, gen.is_done)
    for s in states:
        if s.scalars["block"]:
            raise ValueError(f"sharded_step: {s.request_id} is paused inside a step; only "
                             "whole steps run at degree > 1")
    layout = rows_of(gen)
    mine = [s.get("latents") for s in states]
    whole = gather_rows(mine, [s.scalars["tokens"] for s in states], group, rank, degree)
    jobs: dict[str, list] = {}
    for s, rows in zip(states, whole, strict=True):
        lat = layout.from_rows(rows, s.scalars[SHAPES]["latents"])
        for branch in ws.branches(s):
            jobs.setdefault(ws.expert(s), []).append(
                (s, gen._kwargs(s, lat, ws.expert(s), branch)))
    preds: dict[int, list[torch.Tensor]] = {id(s): [] for s in states}
    for expert, items in jobs.items():
        adapter = gen.adapters[expert]
        kws = [kw for _, kw in items]
        full = adapter.prepare(kws)
        local = shard_batch(full, group, rank, degree, adapter.model.config.num_attention_heads,
                            _caches(kws), adapter.model)
        adapter.run_blocks(local, 0, adapter.num_blocks)
        for (s, _), rows in zip(items, unembed_rows(adapter.model, local), strict=True):
            preds[id(s)].append(rows)
    for s, lat in zip(states, mine, strict=True):
        noise = preds[id(s)][0]
        if s.scalars["cfg"]:
            cond, uncond = preds[id(s)]
            noise = uncond + s.scalars["guidance_scale"] * (cond - uncond)
        schedule = gen.schedules.get(s.scalars["num_steps"])
        s.put("latents", unipc_step(schedule, s, noise, lat))
