"""ditmem's attention processor for Qwen-Image's joint (text + image) attention.

It replaces diffusers' ``QwenDoubleStreamAttnProcessor2_0`` per layer and computes the
attention with ``ditmem.ops.paged_attention`` over block-aligned K/V. Two call forms:

* **plain** — what the stock blocks pass (``hidden_states [B, S_img, dim]``,
  ``encoder_hidden_states [B, S_txt, dim]``, optional ``encoder_hidden_states_mask
  [B, S_txt]``, ``image_rotary_emb`` = (img freqs ``[S_img, D/2]``, txt freqs
  ``[S_txt, D/2]``) complex): the patched model's ordinary ``forward`` keeps working.
  Masked text tokens are left out of the keys (they still produce query outputs).
* **packed** — ``packed=PackedJoint``: ``hidden_states [T_img, dim]`` and
  ``encoder_hidden_states [T_txt, dim]`` hold several requests' tokens back to back
  (masked text tokens already dropped), RoPE is per token. Rows past the layout's real
  tokens are padding (see ``packing.MIN_ROWS``): projected, never attended, returned
  as projections of zeros. Returns ``[T_img, dim]``, ``[T_txt, dim]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import torch

from ditmem.models.common.packing import PackedLayout, batch_to_blocks, tiled
from ditmem.ops import paged_attention, planned_attention


@dataclass(slots=True)
class PackedJoint:
    """Layout of one packed joint-attention call (shared by every layer of a forward).

    layout: segments = requests, each ``[its text tokens, its image tokens]``;
    txt_pos / img_pos: int64 [T_txt] / [T_img], row of each text / image token in the
    joint packed order; txt_slots / img_slots: int64 [T_txt] / [T_img], row of each token in
    the blocked K/V layout; txt_freqs / img_freqs: complex [T_txt, D/2] / [T_img, D/2];
    kv_blocks: the blocked K/V buffer ``[2, num_blocks, block_size, H, D]``, allocated by
    the first layer and overwritten (same rows) by the next; the tail rows of each
    request's last block are never written nor read (``paged_attention`` reads the first
    ``kv_lens[b]`` rows only).
    With one request the joint order is ``[text; image]`` and the blocked rows are its
    first rows, so slices replace the index ops (same values).
    exchange: ``None``, or a sequence-parallel head exchange (``ditmem.parallel``): then
    this rank's streams hold only its token shard, ``txt_freqs`` / ``img_freqs`` are that
    shard's rows, and ``exchange.local_rows`` / ``to_heads`` / ``to_tokens`` move Q/K/V to
    the whole sequence for this rank's heads before attention and back after.
    """

    layout: PackedLayout
    txt_pos: torch.Tensor
    img_pos: torch.Tensor
    txt_slots: torch.Tensor
    img_slots: torch.Tensor
    txt_freqs: torch.Tensor
    img_freqs: torch.Tensor
    kv_blocks: torch.Tensor | None = None
    exchange: Any = None

    @staticmethod
    def build(txt_lens, img_lens, txt_freqs, img_freqs, block_size, device) -> PackedJoint:
        """txt_lens/img_lens: per-request token counts (ints); freqs already packed."""
        lens = [t + i for t, i in zip(txt_lens, img_lens, strict=True)]
        layout = PackedLayout.build(lens, block_size, device)
        if len(lens) == 1:  # joint rows = blocked rows = [text; image]
            rows = layout.slots
            txt_pos, img_pos = rows[: txt_lens[0]], rows[txt_lens[0] :]
            return PackedJoint(layout, txt_pos, img_pos, txt_pos, img_pos, txt_freqs, img_freqs)
        starts = list(accumulate(lens[:-1], initial=0))  # each request's first joint row
        txt_pos = _rows_at(txt_lens, starts, device)
        img_pos = _rows_at(img_lens, [c + t for c, t in zip(starts, txt_lens, strict=True)],
                           device)
        return PackedJoint(
            layout, txt_pos, img_pos, layout.slots[txt_pos], layout.slots[img_pos],
            txt_freqs, img_freqs,
        )

    @property
    def single(self) -> bool:
        """One request: joint order ``[text; image]``, blocked rows ``0 .. L-1``."""
        return len(self.layout.lengths) == 1

    def joint(self, txt: torch.Tensor, img: torch.Tensor) -> torch.Tensor:
        """Text rows ``[T_txt, ...]`` and image rows ``[T_img, ...]`` -> ``[T, ...]`` in the
        joint packed order (the query layout of ``paged_attention``)."""
        if self.single:
            return torch.cat([txt, img])
        out = txt.new_empty(self.layout.total, *txt.shape[1:])
        out.index_copy_(0, self.txt_pos, txt)
        out.index_copy_(0, self.img_pos, img)
        return out

    def to_blocks(self, tk, k, tv, v) -> tuple[torch.Tensor, torch.Tensor]:
        """Write text / image K and V ``[T_txt | T_img, H, D]`` into the reused blocked
        buffer; returns its K and V block pools ``[num_blocks, block_size, H, D]``."""
        lay = self.layout
        buf = self.kv_blocks
        if buf is None or buf.shape[3:] != k.shape[1:] or buf.dtype != k.dtype:
            buf = k.new_empty(2, lay.num_blocks, lay.block_size, *k.shape[1:])
            self.kv_blocks = buf
        flat = buf.view(2, lay.padded_total, *k.shape[1:])
        n_txt = tk.shape[0]
        for dst, t, i in ((flat[0], tk, k), (flat[1], tv, v)):
            if self.single:
                dst[:n_txt].copy_(t)
                dst[n_txt : n_txt + i.shape[0]].copy_(i)
            else:
                dst.index_copy_(0, self.txt_slots, t)
                dst.index_copy_(0, self.img_slots, i)
        return buf[0], buf[1]

    def split(self, o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Joint-order rows ``[T, ...]`` -> (image rows, text rows)."""
        if self.single:
            n_txt = self.txt_pos.shape[0]
            return o[n_txt:], o[:n_txt]
        return o.index_select(0, self.img_pos), o.index_select(0, self.txt_pos)


def _rows_at(lens: list[int], firsts: list[int], device) -> torch.Tensor:
    """int64 ``[sum(lens)]``: rows ``firsts[b] .. firsts[b] + lens[b] - 1`` for each b, in
    order."""
    shift = torch.tensor([f - c for f, c in zip(firsts, accumulate(lens, initial=0),
                                                strict=False)])
    rows = torch.arange(sum(lens))
    if len(lens) > 1:
        rows = rows + torch.repeat_interleave(shift, torch.tensor(lens))
    else:
        rows = rows + shift[0]
    return rows.to(device)


def rotate(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Apply RoPE: x [..., S, H, D] real, freqs [S, D/2] complex; adjacent pairs rotate."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs.unsqueeze(-2)).flatten(-2).type_as(x)


def _project(attn, img: torch.Tensor, txt: torch.Tensor):
    """Q/K/V of both streams, split into heads and QK-normed: six tensors [..., H, D]."""
    head_dim = attn.inner_dim // attn.heads
    q, k, v = (
        tiled(f, img).unflatten(-1, (-1, head_dim)) for f in (attn.to_q, attn.to_k, attn.to_v)
    )
    tq, tk, tv = (
        tiled(f, txt).unflatten(-1, (-1, head_dim))
        for f in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
    )
    if attn.norm_q is not None:
        q = attn.norm_q(q)
    if attn.norm_k is not None:
        k = attn.norm_k(k)
    if attn.norm_added_q is not None:
        tq = attn.norm_added_q(tq)
    if attn.norm_added_k is not None:
        tk = attn.norm_added_k(tk)
    return q, k, v, tq, tk, tv


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])])


def _out(attn, img_o: torch.Tensor, txt_o: torch.Tensor):
    img_o = tiled(attn.to_out[0], img_o.contiguous())
    if len(attn.to_out) > 1:
        img_o = attn.to_out[1](img_o)
    return img_o, tiled(attn.to_add_out, txt_o.contiguous())


class DitmemQwenAttnProcessor:
    """Joint attention through ``ditmem.ops.paged_attention`` (see module docstring)."""

    def __init__(self, block_size: int = 64):
        self.block_size = block_size

    def __call__(
        self,
        attn,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_hidden_states_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb=None,
        packed: PackedJoint | None = None,
    ):
        if encoder_hidden_states is None:
            raise ValueError("DitmemQwenAttnProcessor: encoder_hidden_states (text) is required")
        if attention_mask is not None:
            raise ValueError(
                "DitmemQwenAttnProcessor: attention_mask is not accepted; pass "
                "encoder_hidden_states_mask"
            )
        if packed is not None:
            return self._packed(attn, hidden_states, encoder_hidden_states, packed)
        return self._plain(
            attn, hidden_states, encoder_hidden_states, encoder_hidden_states_mask,
            image_rotary_emb,
        )

    def _packed(self, attn, img, txt, p: PackedJoint):
        ex = p.exchange
        n_txt, n_img = (p.txt_pos.numel(), p.img_pos.numel()) if ex is None else ex.local_rows
        q, k, v, tq, tk, tv = _project(attn, img, txt)
        q, k, v, tq, tk, tv = q[:n_img], k[:n_img], v[:n_img], tq[:n_txt], tk[:n_txt], tv[:n_txt]
        q, k = rotate(q, p.img_freqs), rotate(k, p.img_freqs)
        tq, tk = rotate(tq, p.txt_freqs), rotate(tk, p.txt_freqs)
        if ex is not None:  # this rank's tokens, all heads -> all tokens, this rank's heads
            (tq, tk, tv), (q, k, v) = ex.to_heads(
                [torch.stack([tq, tk, tv], 1), torch.stack([q, k, v], 1)])
        k_blocks, v_blocks = p.to_blocks(tk, k, tv, v)
        lay = p.layout
        o = planned_attention(p.joint(tq, q), k_blocks, v_blocks, lay.plan).flatten(1)
        img_o, txt_o = p.split(o)
        if ex is not None:
            txt_o, img_o = ex.to_tokens([txt_o, img_o])
        return _out(attn, _pad_rows(img_o, img.shape[0]), _pad_rows(txt_o, txt.shape[0]))

    def _plain(self, attn, img, txt, mask, rope):
        batch, s_img, s_txt = img.shape[0], img.shape[1], txt.shape[1]
        q, k, v, tq, tk, tv = _project(attn, img, txt)
        if rope is not None:
            img_freqs, txt_freqs = rope
            q, k = rotate(q, img_freqs), rotate(k, img_freqs)
            tq, tk = rotate(tq, txt_freqs), rotate(tk, txt_freqs)
        jq, jk, jv = torch.cat([tq, q], 1), torch.cat([tk, k], 1), torch.cat([tv, v], 1)
        s = s_txt + s_img
        cu_q = torch.arange(batch + 1, dtype=torch.int32, device=img.device) * s
        if mask is None:  # every key is valid: each batch item is one dense segment
            k_blocks, table, kv_lens = batch_to_blocks(jk, self.block_size)
            v_blocks = batch_to_blocks(jv, self.block_size)[0]
        else:  # masked text keys are dropped from the key rows
            keep = torch.ones(batch, s, dtype=torch.bool, device=img.device)
            keep[:, :s_txt] = mask.to(torch.bool)
            lay = PackedLayout.build(keep.sum(1).tolist(), self.block_size, img.device)
            k_blocks, v_blocks = lay.to_blocks(jk[keep]), lay.to_blocks(jv[keep])
            table, kv_lens = lay.block_table, lay.kv_lens
        o = paged_attention(
            jq.reshape(batch * s, *jq.shape[2:]), k_blocks, v_blocks, cu_q, table, kv_lens
        ).reshape(batch, s, -1)
        return _out(attn, o[:, s_txt:], o[:, :s_txt])
