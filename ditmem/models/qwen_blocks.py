"""Packed Qwen-Image transformer blocks: rows of several requests with per-token modulation.

Shared by the packed forward (:mod:`ditmem.models.qwen_packed`). Activations of a packed
batch are token rows of all requests back to back; per-request quantities (timestep
embedding, modulation) are computed one request at a time and expanded to rows through
segment ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ditmem.models.packing import tiled
from ditmem.models.qwen_attention import PackedJoint


@dataclass(slots=True)
class PackedBatch:
    """Packed activations between stages.

    img: [T_img, dim]; txt: [T_txt, dim] — all requests' rows back to back, each stream
    padded with zero rows to at least ``MIN_ROWS``; temb: [B, dim] (one row per request);
    img_seg / txt_seg: int64 segment id per row; img_lens / txt_lens: real image / valid
    text rows per request; joint: the attention layout; blocks_done: transformer blocks run.
    """

    img: torch.Tensor
    txt: torch.Tensor
    temb: torch.Tensor
    img_seg: torch.Tensor
    txt_seg: torch.Tensor
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


def per_row(fn, x: torch.Tensor) -> torch.Tensor:
    """Apply ``fn`` to each row of ``x [B, ...]`` separately and stack: per-request
    conditioning (timestep embedding, modulation) then does not depend on which other
    requests share the batch (BLAS picks different kernels for different small M)."""
    return torch.cat([fn(x[i : i + 1]) for i in range(x.shape[0])])


def segment_ids(seg: torch.Tensor, lens: list[int], rows: int) -> torch.Tensor:
    """Segment id of every row; padding rows borrow segment 0 (their values are unused)."""
    ids = torch.repeat_interleave(seg, torch.tensor(lens, device=seg.device))
    return torch.cat([ids, ids.new_zeros(rows - ids.shape[0])])


def per_token(params: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
    """Per-request rows ``[B, k]`` -> per-token rows ``[T, k]`` (a broadcastable ``[1, k]``
    when there is one request: the same values, no copy)."""
    return params if params.shape[0] == 1 else params.index_select(0, seg)


def run_block(block, batch: PackedBatch) -> None:
    """One ``QwenImageTransformerBlock`` on packed rows, with per-token modulation."""
    img_mod = per_token(per_row(block.img_mod, batch.temb), batch.img_seg).chunk(6, dim=-1)
    txt_mod = per_token(per_row(block.txt_mod, batch.temb), batch.txt_seg).chunk(6, dim=-1)
    # chunks: shift1, scale1, gate1 (attention), shift2, scale2, gate2 (MLP)
    img, txt = batch.img, batch.txt
    img_in = block.img_norm1(img) * (1 + img_mod[1]) + img_mod[0]
    txt_in = block.txt_norm1(txt) * (1 + txt_mod[1]) + txt_mod[0]
    img_attn, txt_attn = block.attn(
        hidden_states=img_in, encoder_hidden_states=txt_in, packed=batch.joint
    )
    img = img + img_mod[2] * img_attn
    txt = txt + txt_mod[2] * txt_attn
    img_in2 = block.img_norm2(img) * (1 + img_mod[4]) + img_mod[3]
    img = img + img_mod[5] * tiled(block.img_mlp, img_in2)
    txt_in2 = block.txt_norm2(txt) * (1 + txt_mod[4]) + txt_mod[3]
    txt = txt + txt_mod[5] * tiled(block.txt_mlp, txt_in2)
    if txt.dtype == torch.float16:
        txt = txt.clip(-65504, 65504)
    if img.dtype == torch.float16:
        img = img.clip(-65504, 65504)
    batch.img, batch.txt = img, txt
