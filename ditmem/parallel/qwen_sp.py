"""Sequence-parallel packed step of Qwen-Image (joint text + image attention).

Each rank of a group holds its token shard of every request: image rows
``shard(S_img_b)`` and valid text rows ``shard(S_txt_b)`` (:mod:`ditmem.parallel.shards`).
:func:`prepare_shard` embeds those rows into a ``PackedBatch`` whose streams, row
segments and RoPE rows are the shard's, and whose joint layout describes the WHOLE batch
(what attention sees after the exchange) with a :class:`HeadExchange` attached. The
adapter's own ``run_blocks`` and ``finish`` then run unchanged: per request they return
this rank's rows of the prediction ``[1, n_b, C_out]``, and the solver update (per token)
runs on those rows only.
"""

from __future__ import annotations

import torch

from ditmem.models.common.packing import pad_to_min, rowwise
from ditmem.models.qwen.attention import PackedJoint
from ditmem.models.qwen.blocks import PackedBatch, Segments
from ditmem.parallel.exchange import HeadExchange
from ditmem.parallel.shards import shard


def _valid_text(kw: dict, model):
    """(valid text rows ``[L, D]``, their RoPE rows, image RoPE rows) of one request, as
    ``QwenAdapter.prepare`` derives them."""
    ehs = kw["encoder_hidden_states"][0]
    mask = kw.get("encoder_hidden_states_mask")
    freqs_img, freqs_txt = model.pos_embed(kw["img_shapes"], max_txt_seq_len=ehs.shape[0],
                                           device=ehs.device)
    if mask is not None:
        valid = mask[0].to(torch.bool)
        ehs, freqs_txt = ehs[valid], freqs_txt[valid]
    return ehs, freqs_txt, freqs_img


@torch.no_grad()
def prepare_shard(adapter, kwargs_list: list[dict], group, rank: int, degree: int,
                  boundary=None, start_block: int = 0) -> PackedBatch:
    """This rank's part of ``adapter.prepare(kwargs_list)`` in a group of ``degree``.

    kwargs_list: per request (CFG branch) the batch-1 forward kwargs of
    ``QwenAdapter.prepare`` except ``hidden_states``, which holds only this rank's image
    rows ``[1, hi - lo, C]`` (``(lo, hi) = shard(S_img, degree, rank)``); text embeddings
    and mask are whole (the valid rows are sharded here). boundary: to resume inside a
    step, per request this rank's ``(img rows, txt rows)`` after ``start_block`` blocks.
    """
    if not kwargs_list:
        raise ValueError("prepare_shard: kwargs_list is empty")
    if (start_block > 0) != (boundary is not None):
        raise ValueError(f"prepare_shard: start_block={start_block} needs boundary iff > 0")
    if boundary is not None and len(boundary) != len(kwargs_list):
        raise ValueError(f"prepare_shard: boundary has {len(boundary)} entries for "
                         f"{len(kwargs_list)} requests")
    m = adapter.model
    img_full, txt_full, hs, txts, img_f, txt_f, steps = [], [], [], [], [], [], []
    for i, kw in enumerate(kwargs_list):
        ehs, freqs_txt, freqs_img = _valid_text(kw, m)
        (lo, hi), (tlo, thi) = shard(freqs_img.shape[0], degree, rank), \
            shard(ehs.shape[0], degree, rank)
        x = kw["hidden_states"]
        if x.dim() != 3 or x.shape[0] != 1 or x.shape[1] != hi - lo:
            raise ValueError(f"prepare_shard: request {i} hidden_states {tuple(x.shape)} is not "
                             f"rank {rank}'s shard [1, {hi - lo}, C] of {freqs_img.shape[0]} rows")
        if kw.get("timestep") is None or kw["timestep"].numel() != 1:
            raise ValueError(f"prepare_shard: request {i} needs a single timestep")
        img_full.append(freqs_img.shape[0])
        txt_full.append(ehs.shape[0])
        hs.append(x[0])
        txts.append(ehs[tlo:thi])
        img_f.append(freqs_img[lo:hi])
        txt_f.append(freqs_txt[tlo:thi])
        steps.append(kw["timestep"].reshape(1))
    img_loc = [t.shape[0] for t in hs]
    txt_loc = [t.shape[0] for t in txts]
    if boundary is None:
        img = m.img_in(pad_to_min(torch.cat(hs)))
        txt = m.txt_in(m.txt_norm(pad_to_min(torch.cat(txts))))
    else:
        for i, (b, n_img, n_txt) in enumerate(zip(boundary, img_loc, txt_loc, strict=True)):
            if b[0].shape[0] != n_img or b[1].shape[0] != n_txt:
                raise ValueError(f"prepare_shard: boundary[{i}] has {b[0].shape[0]} / "
                                 f"{b[1].shape[0]} rows, shard holds {n_img} / {n_txt}")
        img = pad_to_min(torch.cat([b[0] for b in boundary]))
        txt = pad_to_min(torch.cat([b[1] for b in boundary]))
    timestep = torch.cat(steps).to(img.dtype)
    tt = m.time_text_embed
    emb = tt.timestep_embedder
    layers = [f for f in (emb.linear_1, emb.act, emb.linear_2, emb.post_act) if f is not None]
    temb = rowwise(layers, tt.time_proj(timestep).to(img.dtype))
    device = img.device
    joint = PackedJoint.build(txt_full, img_full, torch.cat(txt_f), torch.cat(img_f),
                              adapter.block_size, device)
    heads = m.transformer_blocks[0].attn.heads
    joint.exchange = HeadExchange.build(group, rank, degree, [txt_full, img_full], heads, device)
    return PackedBatch(
        img=img, txt=txt, temb=temb,
        img_rows=Segments.build(img_loc, img.shape[0], device),
        txt_rows=Segments.build(txt_loc, txt.shape[0], device),
        img_lens=img_loc, txt_lens=txt_loc, joint=joint, blocks_done=start_block,
    )


def forward_shard(adapter, kwargs_list: list[dict], group, rank: int,
                  degree: int) -> list[torch.Tensor]:
    """One whole sequence-parallel forward: this rank's rows of every request's prediction,
    ``[1, n_b, C_out]`` each (the rows ``shard(S_img_b, degree, rank)`` of what
    ``adapter.forward_packed`` returns)."""
    batch = prepare_shard(adapter, kwargs_list, group, rank, degree)
    adapter.run_blocks(batch, 0, adapter.num_blocks)
    return adapter.finish(batch)
