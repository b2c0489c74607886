"""Wan attention processors that run through ``ditmem.ops.paged_attention``.

``WanSelfAttention`` replaces ``attn1`` (video self-attention with 3-D RoPE) and
``WanCrossAttention`` replaces ``attn2`` (video queries, text keys/values) of each
``WanTransformerBlock``. Both serve two kinds of call:

* the stock call ``attn(hidden [B, S, dim], encoder_hidden_states, None, rotary_emb)`` made
  by ``WanTransformer3DModel.forward`` on a patched model: each batch item becomes one
  segment of a ragged batch, so the patched model returns what the stock one does;
* the packed call of ``forward_packed``: ``hidden [1, T', dim]`` holds B requests' T
  tokens back to back (then zero rows up to T' >= 16, see wan/packed.py) and ``packed=`` (a
  :class:`PackedAttention`) says where each request's
  tokens, RoPE tables and text keys/values are. Metadata travels as this keyword argument
  (``WanAttention.forward`` hands extra keywords to its processor), never as global state.

Text keys/values come either from packed text embeddings (recomputed every call) or from a
request's cached cross-attention pages (:mod:`ditmem.models.wan.kv_cache`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ditmem.models.common.packing import PackedLayout
from ditmem.ops import planned_attention
from ditmem.ops.plan import AttentionPlan


@dataclass(slots=True)
class RopeTable:
    """RoPE factors for packed tokens: ``cos``/``sin`` float64 ``[T, 1, D/2]`` (the even
    columns of Wan's cos table and the odd columns of its sin table)."""

    cos: torch.Tensor
    sin: torch.Tensor

    @staticmethod
    def from_wan(freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> RopeTable:
        """From ``WanRotaryPosEmbed`` output ``[..., S, 1, D]`` (any leading dims of 1)."""
        return RopeTable(freqs_cos[..., 0::2], freqs_sin[..., 1::2])


@dataclass(slots=True)
class CachedTextKV:
    """Cross-attention keys/values read from pages for one packed call.

    views: per layer, ``(k_cache, v_cache, plan)``: block pools
    ``[num_blocks, block_size, H, D]`` (views of one arena, contiguous blocks) and the
    :class:`AttentionPlan` of the packed queries over them (built once per step, shared by
    the layers of one page group); heads: ``None`` (the pools hold every head), or the
    head range they hold (a sequence-parallel rank's, compacted copies).
    """

    views: list[tuple[torch.Tensor, torch.Tensor, AttentionPlan]]
    heads: slice | None = None


@dataclass(slots=True)
class PackedAttention:
    """Where B requests live in one packed forward.

    layout: the video tokens' :class:`PackedLayout`; rope: their RoPE factors; text: packed
    text embeddings ``[1, T_text, dim]`` with text_layout, or ``None`` when cached is given.
    exchange: ``None``, or a sequence-parallel head exchange (``ditmem.parallel``): then
    the hidden rows are this rank's token shard, ``rope`` covers those rows, and the
    processors move Q/K/V to the whole sequence for this rank's heads
    (``exchange.to_heads``), read text K/V of those heads only (``exchange.heads``) and
    move the output back (``exchange.to_tokens``).
    """

    layout: PackedLayout
    rope: RopeTable
    text: torch.Tensor | None = None
    text_layout: PackedLayout | None = None
    cached: CachedTextKV | None = None
    exchange: Any = None
    _text_plan: AttentionPlan | None = field(default=None, repr=False)

    def text_plan(self) -> AttentionPlan:
        """The plan of the video queries over the packed text K/V, built on first use and
        reused by every layer of the step."""
        if self._text_plan is None:
            self._text_plan = self.layout.cross_plan(self.text_layout)
        return self._text_plan


def apply_rope(x: torch.Tensor, rope: RopeTable) -> torch.Tensor:
    """Rotate interleaved pairs of ``x [..., T, H, D]`` by ``rope`` (float64 math like Wan,
    result in x's dtype)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * rope.cos - x2 * rope.sin  # float64 products, cast on store
    out[..., 1::2] = x1 * rope.sin + x2 * rope.cos
    return out


def _blocked(layout: PackedLayout, x: torch.Tensor) -> torch.Tensor:
    """Packed rows ``[T, H, D]`` as the layout's block pool; a zero-copy view when every
    segment fills whole blocks (then the packed layout already is the blocked one)."""
    if layout.padded_total == layout.total:
        return x.contiguous().view(layout.num_blocks, layout.block_size, *x.shape[1:])
    return layout.to_blocks(x)


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x [n, ...]`` followed by zero rows up to ``rows`` (the packed stream's padding)."""
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])])


def _heads(attn, x: torch.Tensor) -> torch.Tensor:
    return x.unflatten(-1, (attn.heads, -1))


def text_kv(attn, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys (after norm_k) and values ``[..., L, H, D]`` of text embeddings ``[..., L, dim]``
    (what the cross-attention cache stores)."""
    if getattr(attn, "fused_projections", False):
        key, value = attn.to_kv(text).chunk(2, dim=-1)
    else:
        key, value = attn.to_k(text), attn.to_v(text)
    return _heads(attn, attn.norm_k(key)), _heads(attn, value)


def _output(attn, out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    out = out.flatten(-2).type_as(like)
    return attn.to_out[1](attn.to_out[0](out))


def _check_stock_call(attn, attention_mask) -> None:
    if attention_mask is not None:
        raise ValueError("attention_mask: Wan's processors take no mask; ditmem's do not either")
    if attn.add_k_proj is not None:
        raise NotImplementedError("image-conditioned Wan (added K/V projections) is not supported")


class WanSelfAttention:
    """``attn1`` processor: ragged self-attention of video tokens with per-request RoPE."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None, packed: PackedAttention | None = None) -> torch.Tensor:
        """hidden_states ``[B, S, dim]`` (stock) or ``[1, T, dim]`` with ``packed``."""
        _check_stock_call(attn, attention_mask)
        if getattr(attn, "fused_projections", False):
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query = attn.to_q(hidden_states)
            key, value = attn.to_k(hidden_states), attn.to_v(hidden_states)
        query = _heads(attn, attn.norm_q(query))
        key = _heads(attn, attn.norm_k(key))
        value = _heads(attn, value)
        batch, seq = hidden_states.shape[:2]
        if packed is None:
            layout = PackedLayout.build([seq] * batch, device=hidden_states.device)
            rope = None
            if rotary_emb is not None:  # [1, S, 1, D] tables, the same for every batch item
                cos, sin = (t[0].repeat(batch, 1, 1) for t in rotary_emb)
                rope = RopeTable.from_wan(cos, sin)
        else:
            layout, rope = packed.layout, packed.rope
        ex = None if packed is None else packed.exchange
        # packed hidden may carry padding rows after the real tokens
        rows = layout.total if ex is None else ex.local_rows[0]
        query, key, value = (t.flatten(0, 1)[:rows] for t in (query, key, value))
        if rope is not None:
            query, key = apply_rope(query, rope), apply_rope(key, rope)
        if ex is not None:  # this rank's tokens, all heads -> all tokens, this rank's heads
            ((query, key, value),) = ex.to_heads([torch.stack([query, key, value], 1)])
        out = planned_attention(query, _blocked(layout, key), _blocked(layout, value),
                                layout.plan)
        if ex is not None:
            (out,) = ex.to_tokens([out])
        return _output(attn, _pad(out, batch * seq).unflatten(0, (batch, seq)), query)


class WanCrossAttention:
    """``attn2`` processor for transformer layer ``layer``: video queries over text K/V."""

    def __init__(self, layer: int) -> None:
        self.layer = layer

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None, packed: PackedAttention | None = None) -> torch.Tensor:
        """hidden_states ``[B, S, dim]`` with text ``[B, L, dim]`` (stock), or ``[1, T, dim]``
        with ``packed`` (text packed alongside or read from cached pages)."""
        _check_stock_call(attn, attention_mask)
        query = _heads(attn, attn.norm_q(attn.to_q(hidden_states)))
        batch, seq = hidden_states.shape[:2]
        if packed is None:
            q_layout = PackedLayout.build([seq] * batch, device=hidden_states.device)
            kv_layout = PackedLayout.build([encoder_hidden_states.shape[1]] * batch,
                                           device=hidden_states.device)
            text = encoder_hidden_states
        else:
            q_layout, kv_layout, text = packed.layout, packed.text_layout, packed.text
        ex = None if packed is None else packed.exchange
        heads = slice(None) if ex is None else ex.heads
        if packed is not None and packed.cached is not None:
            k_cache, v_cache, plan = packed.cached.views[self.layer]
            if packed.cached.heads is None:
                k_cache, v_cache = k_cache[:, :, heads], v_cache[:, :, heads]
            elif packed.cached.heads != heads:
                raise ValueError(f"packed.cached holds heads {packed.cached.heads}, the "
                                 f"exchange reads {heads}")
        else:
            key, value = text_kv(attn, text)
            key, value = key[..., heads, :], value[..., heads, :]
            k_cache = _blocked(kv_layout, key.flatten(0, 1)[: kv_layout.total])
            v_cache = _blocked(kv_layout, value.flatten(0, 1)[: kv_layout.total])
            plan = packed.text_plan() if packed is not None else q_layout.cross_plan(kv_layout)
        flat_q = query.flatten(0, 1)[: q_layout.total if ex is None else ex.local_rows[0]]
        if ex is not None:
            ((flat_q,),) = ex.to_heads([flat_q[:, None]])
        out = planned_attention(flat_q, k_cache, v_cache, plan)
        if ex is not None:
            (out,) = ex.to_tokens([out])
        return _output(attn, _pad(out, batch * seq).unflatten(0, (batch, seq)), query)

