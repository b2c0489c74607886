"""Packed Qwen-Image transformer blocks: rows of several requests with per-request modulation.

Shared by the packed forward (:mod:`ditmem.models.qwen.packed`). Activations of a packed
batch are token rows of all requests back to back; per-request quantities (timestep
embedding, modulation) are computed for all requests in one call that gives each request
the bits of its own one-row product (batch-invariant, see ``packing.rowwise_linear``) and
reach the rows through
:class:`Segments` (broadcast where the layout allows, a row gather otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ditmem.models.common.packing import rowwise, tiled
from ditmem.models.qwen.attention import PackedJoint


@dataclass(slots=True)
class Segments:
    """How per-request values ``[B, dim]`` reach the packed rows ``[T, dim]`` of one
    stream (requests' rows back to back, then padding rows up to T).

    * one request: its row broadcasts over all rows;
    * B equal-length requests filling all T rows: rows are viewed as ``[B, L, dim]`` and
      request b's row broadcasts over ``[b, :, :]`` (no per-row copies);
    * otherwise ``seg`` (int64 ``[T]``, padding rows borrow request 0) gathers a row per
      token.

    Elementwise ops give the same bits in all three cases.
    """

    lens: list[int]
    rows: int
    seg: torch.Tensor | None

    @staticmethod
    def build(lens: list[int], rows: int, device) -> Segments:
        """lens: real rows per request; rows: T, the stream's row count incl. padding."""
        if len(lens) == 1 or (len(set(lens)) == 1 and sum(lens) == rows):
            return Segments(lens, rows, None)
        ids = torch.repeat_interleave(
            torch.arange(len(lens), device=device), torch.tensor(lens, device=device)
        )
        return Segments(lens, rows, torch.cat([ids, ids.new_zeros(rows - ids.shape[0])]))

    def view(self, x: torch.Tensor) -> torch.Tensor:
        """Packed rows ``[T, dim]`` shaped to broadcast with :meth:`expand` (a view)."""
        if self.seg is None and len(self.lens) > 1:
            return x.view(len(self.lens), self.lens[0], -1)
        return x

    def expand(self, p: torch.Tensor) -> torch.Tensor:
        """``p [parts, B, dim]`` -> per-part values broadcasting against
        :meth:`view`: ``[parts, 1, dim]``, ``[parts, B, 1, dim]`` or ``[parts, T, dim]``."""
        if self.seg is None:
            return p if len(self.lens) == 1 else p[:, :, None]
        out = p.new_empty(p.shape[0], self.rows, p.shape[2])
        for j in range(p.shape[0]):  # one dense pass per part, straight into place
            torch.index_select(p[j], 0, self.seg, out=out[j])
        return out


@dataclass(slots=True)
class PackedBatch:
    """Packed activations between stages.

    img: [T_img, dim]; txt: [T_txt, dim] — all requests' rows back to back, each stream
    padded with zero rows to at least ``MIN_ROWS``; temb: [B, dim] (row b is request b);
    img_rows / txt_rows: how per-request values reach each stream's rows;
    img_lens / txt_lens: real image / valid text rows per request; joint: the attention
    layout; blocks_done: transformer blocks run.
    """

    img: torch.Tensor
    txt: torch.Tensor
    temb: torch.Tensor
    img_rows: Segments
    txt_rows: Segments
    img_lens: list[int]
    txt_lens: list[int]
    joint: PackedJoint
    blocks_done: int = 0

    def boundary(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per request, its (image rows [S_img, dim], valid text rows [S_txt, dim]) at the
        current block boundary (views; padding excluded)."""
        imgs = torch.split(self.img[: sum(self.img_lens)], self.img_lens)
        txts = torch.split(self.txt[: sum(self.txt_lens)], self.txt_lens)
        return list(zip(imgs, txts, strict=True))


def modulation(mod, temb: torch.Tensor, rows: Segments, scale_parts) -> torch.Tensor:
    """``mod`` (SiLU + Linear to ``k * dim``) of the per-request ``temb``, with 1 added
    to the scale parts (indices ``scale_parts``), expanded for ``rows`` (see
    :meth:`Segments.expand`)."""
    p = rowwise(mod, temb).unflatten(1, (-1, temb.shape[1]))
    for j in scale_parts:
        p[:, j] += 1
    return rows.expand(p.transpose(0, 1))


def run_block(block, batch: PackedBatch) -> None:
    """One ``QwenImageTransformerBlock`` on packed rows, with per-request modulation."""
    # parts: shift1, 1 + scale1, gate1 (attention), shift2, 1 + scale2, gate2 (MLP)
    ir, tr = batch.img_rows, batch.txt_rows
    im = modulation(block.img_mod, batch.temb, ir, (1, 4))
    tm = modulation(block.txt_mod, batch.temb, tr, (1, 4))
    img, txt = batch.img, batch.txt
    img_in = (ir.view(block.img_norm1(img)) * im[1] + im[0]).view_as(img)
    txt_in = (tr.view(block.txt_norm1(txt)) * tm[1] + tm[0]).view_as(txt)
    attn = block.attn
    img_attn, txt_attn = attn.processor(attn, img_in, txt_in, packed=batch.joint)
    img = (ir.view(img) + im[2] * ir.view(img_attn)).view_as(img)
    txt = (tr.view(txt) + tm[2] * tr.view(txt_attn)).view_as(txt)
    img_in2 = (ir.view(block.img_norm2(img)) * im[4] + im[3]).view_as(img)
    img = (ir.view(img) + im[5] * ir.view(tiled(block.img_mlp, img_in2))).view_as(img)
    txt_in2 = (tr.view(block.txt_norm2(txt)) * tm[4] + tm[3]).view_as(txt)
    txt = (tr.view(txt) + tm[5] * tr.view(tiled(block.txt_mlp, txt_in2))).view_as(txt)
    if txt.dtype == torch.float16:
        txt = txt.clip(-65504, 65504)
    if img.dtype == torch.float16:
        img = img.clip(-65504, 65504)
    batch.img, batch.txt = img, txt
