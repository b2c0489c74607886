"""One ``WanTransformer3DModel`` forward over several requests packed back to back.

Requests may differ in frame count, resolution, timestep (scalar, or per token as in
Wan2.2 TI2V) and text. The pieces, in forward order:

* :func:`embed` — per request: RoPE tables, patch embedding; then the tokens of all
  requests concatenated ``[1, T, dim]`` with their :class:`PackedLayout`, and the timestep
  conditioning of every request: ``temb [R, dim]`` and ``proj [R, 6, dim]`` (one row per
  request, or one per token for per-token timesteps) with each request's row range;
* :func:`run_blocks` — transformer blocks ``start .. stop`` with each request's tokens
  modulated by its own rows and ditmem's ragged attention processors;
* :func:`unembed` — output norm/projection and each request's unpatchify back to
  ``[1, C, F, H, W]``.

The arithmetic of every element is the stock block's (same ops, same dtypes); only the
batching differs, so results match per-request stock forwards to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ditmem.models.common.packing import PackedLayout, pad_to_min
from ditmem.models.wan.attention import PackedAttention, RopeTable


@dataclass(slots=True)
class PackedBatch:
    """Activations and conditioning of B packed requests.

    hidden: ``[1, T', dim]``, the T real tokens then zero rows up to ``T' = max(T, 16)``;
    layout: segment b = request b's tokens; grids: post-patch
    ``(frames, height, width)`` per request; temb: ``[R, dim]``; proj: ``[R, 6, dim]``;
    segments: per request ``(token slice, row slice)``: its tokens and the conditioning rows
    that modulate them (one row broadcast, or one row per token); attention: what the
    processors read; blocks_done: blocks already run on ``hidden``.
    """

    hidden: torch.Tensor
    layout: PackedLayout
    grids: list[tuple[int, int, int]]
    temb: torch.Tensor
    proj: torch.Tensor
    segments: list[tuple[slice, slice]]
    attention: PackedAttention
    blocks_done: int = 0

    def boundary(self) -> list[torch.Tensor]:
        """Per request, its hidden rows ``[S_b, dim]`` at the current block boundary (views):
        everything a step paused here cannot cheaply recompute."""
        return self.layout.split(self.hidden[0, : self.layout.total])


def _timestep_rows(i: int, timestep, num_tokens: int) -> torch.Tensor:
    """A request's timesteps as a 1-D tensor: 1 row (scalar) or ``num_tokens`` rows."""
    t = torch.as_tensor(timestep)
    if t.dim() == 2 and t.shape == (1, num_tokens):
        return t[0]
    if t.numel() == 1:
        return t.reshape(1)
    raise ValueError(f"requests[{i}]['timestep']: shape {tuple(t.shape)} is neither [1] nor "
                     f"[1, {num_tokens}]")


def _check_hidden(model, i: int, x) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 5 or x.shape[0] != 1:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"requests[{i}]['hidden_states']: expected [1, C, F, H, W], got {shape}")
    p_t, p_h, p_w = model.config.patch_size
    if x.shape[1] != model.config.in_channels or x.shape[2] % p_t or x.shape[3] % p_h or \
            x.shape[4] % p_w:
        raise ValueError(f"requests[{i}]['hidden_states']: shape {tuple(x.shape)} needs "
                         f"{model.config.in_channels} channels and F, H, W divisible by "
                         f"the patch {tuple(model.config.patch_size)}")


def embed(model, requests: list[dict], text: list[torch.Tensor] | None) -> PackedBatch:
    """Patch-embed and condition B requests.

    requests: dicts with ``hidden_states [1, C, F, H, W]`` and ``timestep`` ([1] or
    [1, S]); text: per request ``[1, L_b, text_dim]`` to embed and pack for cross-attention,
    or ``None`` when the caller supplies cached K/V (``attention.cached``) afterwards.
    """
    cos, sin, tokens, grids, steps, segments = [], [], [], [], [], []
    p_t, p_h, p_w = model.config.patch_size
    for i, kw in enumerate(requests):
        x = kw["hidden_states"]
        _check_hidden(model, i, x)
        freqs_cos, freqs_sin = model.rope(x)
        cos.append(freqs_cos[0])
        sin.append(freqs_sin[0])
        emb = model.patch_embedding(x.to(model.patch_embedding.weight.dtype))
        tokens.append(emb.flatten(2).transpose(1, 2)[0])
        grids.append((x.shape[2] // p_t, x.shape[3] // p_h, x.shape[4] // p_w))
        t = _timestep_rows(i, kw["timestep"], tokens[-1].shape[0]).to(x.device)
        first_row, first_token = sum(s.numel() for s in steps), sum(len(e) for e in tokens[:-1])
        segments.append((slice(first_token, first_token + len(tokens[-1])),
                         slice(first_row, first_row + t.numel())))
        steps.append(t)
    # At least MIN_ROWS rows (zero padding after the real tokens): MKL's sgemm gives other
    # bits for a row of a matrix with fewer than ~12 rows, which would make a tiny request's
    # result depend on whether it runs alone or packed with others.
    hidden = pad_to_min(torch.cat(tokens)).unsqueeze(0).contiguous()
    layout = PackedLayout.build([t.shape[0] for t in tokens], device=hidden.device)
    # Conditioning per request (not one batched MLP): a request's modulation then does not
    # depend on which requests share the batch (BLAS may pick other kernels for other M).
    temb, proj = (torch.cat(parts) for parts in zip(
        *(_condition(model, t, hidden.dtype) for t in steps), strict=True))
    rope = RopeTable.from_wan(torch.cat(cos), torch.cat(sin))
    attention = PackedAttention(layout=layout, rope=rope)
    if text is not None:
        embedder = model.condition_embedder.text_embedder
        rows = torch.cat([embedder(e.to(hidden.dtype))[0] for e in text])
        attention.text = pad_to_min(rows).unsqueeze(0)
        attention.text_layout = PackedLayout.build([e.shape[1] for e in text],
                                                   device=hidden.device)
    return PackedBatch(hidden, layout, grids, temb, proj, segments, attention)


def _condition(model, timesteps: torch.Tensor, dtype: torch.dtype):
    """Wan's timestep conditioning of R timesteps: ``temb [R, dim]``, ``proj [R, 6, dim]``."""
    ce = model.condition_embedder
    freq = ce.timesteps_proj(timesteps)
    embedder_dtype = next(iter(ce.time_embedder.parameters())).dtype
    if freq.dtype != embedder_dtype and embedder_dtype != torch.int8:
        freq = freq.to(embedder_dtype)
    temb = ce.time_embedder(freq).to(dtype)
    proj = ce.time_proj(ce.act_fn(temb))
    return temb, proj.unflatten(1, (6, -1))


def _modulate_(x: torch.Tensor, segments, scale: torch.Tensor,
               shift: torch.Tensor | None = None) -> torch.Tensor:
    """In place on a fresh float32 ``x [1, T, dim]``: each segment's tokens times its
    ``scale`` rows (``[R, dim]``), plus its ``shift`` rows when given. Elementwise the same
    arithmetic as Wan's broadcast ``x * scale + shift``, without per-token copies of the
    rows."""
    for tokens, rows in segments:
        part = x[0, tokens]
        part.mul_(scale[rows])
        if shift is not None:
            part.add_(shift[rows])
    return x


def block_forward(block, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """One ``WanTransformerBlock`` over packed tokens ``[1, T, dim]``."""
    shift, scale, gate, c_shift, c_scale, c_gate = (
        block.scale_shift_table + batch.proj.float()).unbind(1)
    seg, ctx = batch.segments, batch.attention
    normed = _modulate_(block.norm1(hidden.float()), seg, 1 + scale, shift).type_as(hidden)
    attn_out = block.attn1(normed, None, None, None, packed=ctx)
    hidden = (hidden.float() + _modulate_(attn_out.float(), seg, gate)).type_as(hidden)
    normed = block.norm2(hidden.float()).type_as(hidden)
    hidden = hidden + block.attn2(normed, None, None, None, packed=ctx)
    normed = _modulate_(block.norm3(hidden.float()), seg, 1 + c_scale, c_shift).type_as(hidden)
    ff_out = block.ffn(normed)
    return (hidden.float() + _modulate_(ff_out.float(), seg, c_gate)).type_as(hidden)


def run_blocks(model, batch: PackedBatch, start: int = 0, stop: int | None = None) -> None:
    """Run blocks ``start .. stop`` (default: all) in place on ``batch.hidden``."""
    stop = len(model.blocks) if stop is None else stop
    if not 0 <= start <= stop <= len(model.blocks):
        raise ValueError(f"start/stop: {start}..{stop} is not a range of "
                         f"{len(model.blocks)} blocks")
    for block in model.blocks[start:stop]:
        batch.hidden = block_forward(block, batch.hidden, batch)


def unembed(model, batch: PackedBatch) -> list[torch.Tensor]:
    """Output norm and projection, then each request's ``[1, C, F, H, W]``."""
    shift, scale = (model.scale_shift_table[0] + batch.temb.unsqueeze(1)).unbind(1)
    hidden = batch.hidden
    normed = _modulate_(model.norm_out(hidden.float()), batch.segments, 1 + scale, shift)
    hidden = normed.type_as(hidden)
    hidden = model.proj_out(hidden)[0, : batch.layout.total]
    p_t, p_h, p_w = model.config.patch_size
    outs = []
    for seg, (f, h, w) in zip(batch.layout.split(hidden), batch.grids, strict=True):
        x = seg.reshape(1, f, h, w, p_t, p_h, p_w, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        outs.append(x.flatten(6, 7).flatten(4, 5).flatten(2, 3))
    return outs
