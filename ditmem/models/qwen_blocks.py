"""Packed Qwen-Image transformer blocks: rows of several requests with per-token modulation.

Shared by the packed forward (:mod:`ditmem.models.qwen_packed`). Activations of a packed
batch are token rows of all requests back to back; per-request quantities (timestep
embedding, modulation) are computed one request at a time and expanded to rows through
segment ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ditmem.models.qwen_attention import PackedJoint

# BLAS (MKL sgemm) computes a row differently when a matrix has fewer than ~12 rows, so a
# request's tokens would change bits depending on who shares the batch. Both packed streams
# are padded with zero rows to at least MIN_ROWS rows; per-request conditioning runs one
# row at a time (``per_row``) for the same reason.
MIN_ROWS = 16



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


def pad_to_min(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] >= MIN_ROWS:
        return x
    return torch.cat([x, x.new_zeros(MIN_ROWS - x.shape[0], *x.shape[1:])])


def segment_ids(seg: torch.Tensor, lens: list[int], rows: int) -> torch.Tensor:
    """Segment id of every row; padding rows borrow segment 0 (their values are unused)."""
    ids = torch.repeat_interleave(seg, torch.tensor(lens, device=seg.device))
    return torch.cat([ids, ids.new_zeros(rows - ids.shape[0])])


def _modulate(x, params, seg):
    """x [T, dim]; params [B, 3*dim] (shift, scale, gate); seg [T] -> (x', gate [T, dim])."""
    shift, scale, gate = params.chunk(3, dim=-1)
    return x * (1 + scale[seg]) + shift[seg], gate[seg]


def run_block(block, batch: PackedBatch) -> None:
    """One ``QwenImageTransformerBlock`` on packed rows, with per-token modulation."""
    img_mod1, img_mod2 = per_row(block.img_mod, batch.temb).chunk(2, dim=-1)
    txt_mod1, txt_mod2 = per_row(block.txt_mod, batch.temb).chunk(2, dim=-1)
    img, txt = batch.img, batch.txt
    img_in, img_gate1 = _modulate(block.img_norm1(img), img_mod1, batch.img_seg)
    txt_in, txt_gate1 = _modulate(block.txt_norm1(txt), txt_mod1, batch.txt_seg)
    img_attn, txt_attn = block.attn(
        hidden_states=img_in, encoder_hidden_states=txt_in, packed=batch.joint
    )
    img = img + img_gate1 * img_attn
    txt = txt + txt_gate1 * txt_attn
    img_in2, img_gate2 = _modulate(block.img_norm2(img), img_mod2, batch.img_seg)
    img = img + img_gate2 * block.img_mlp(img_in2)
    txt_in2, txt_gate2 = _modulate(block.txt_norm2(txt), txt_mod2, batch.txt_seg)
    txt = txt + txt_gate2 * block.txt_mlp(txt_in2)
    if txt.dtype == torch.float16:
        txt = txt.clip(-65504, 65504)
    if img.dtype == torch.float16:
        img = img.clip(-65504, 65504)
    batch.img, batch.txt = img, txt
