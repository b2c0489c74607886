"""Packed forward of a patched ``QwenImageTransformer2DModel``: several batch-1 requests
(different resolutions, text lengths, timesteps) in ONE pass.

Activations are packed token rows: image tokens ``[T_img, dim]`` and *valid* text tokens
``[T_txt, dim]`` of all requests back to back (masked text tokens never influence image
outputs, so they are dropped). Timestep modulation is computed per request ``[B, 6*dim]``
and expanded per token through ``img_seg`` / ``txt_seg`` (segment id of every row). RoPE is
computed per request with the model's own ``pos_embed`` (which supports one image size per
call) and concatenated. Joint attention goes through ``DitmemQwenAttnProcessor`` with a
:class:`PackedJoint` layout.

The stages are separate so that a step can be split at block boundaries::

    batch = adapter.prepare([kw1, kw2])        # embeddings, RoPE, layout
    adapter.run_blocks(batch, 0, k)            # batch.img / batch.txt are the boundary
    adapter.run_blocks(batch, k, num_layers)   # activations between calls
    outs = adapter.finish(batch)               # [[1, S_img_i, C_out], ...]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ditmem.models.qwen_attention import DitmemQwenAttnProcessor, PackedJoint

# BLAS (MKL sgemm) computes a row differently when a matrix has fewer than ~12 rows, so a
# request's tokens would change bits depending on who shares the batch. Both packed streams
# are padded with zero rows to at least MIN_ROWS rows; per-request conditioning runs one
# row at a time (``per_row``) for the same reason.
MIN_ROWS = 16

UNSUPPORTED_KWARGS = ("guidance", "controlnet_block_samples", "additional_t_cond")


@dataclass(slots=True)
class PackedBatch:
    """Packed activations between stages. img: [T_img, dim]; txt: [T_txt, dim];
    temb: [B, dim] (one row per request); img_seg / txt_seg: int64 segment id per row;
    img_lens: image tokens per request; joint: the attention layout; blocks_done: how many
    transformer blocks have run."""

    img: torch.Tensor
    txt: torch.Tensor
    temb: torch.Tensor
    img_seg: torch.Tensor
    txt_seg: torch.Tensor
    img_lens: list[int]
    joint: PackedJoint
    blocks_done: int = 0


def _check_kwargs(i: int, kw: dict) -> None:
    for name in UNSUPPORTED_KWARGS:
        if kw.get(name) is not None:
            raise ValueError(f"forward_packed: request {i} passes {name}, which is not supported")
    if kw.get("attention_kwargs"):
        raise ValueError(f"forward_packed: request {i} passes attention_kwargs (unsupported)")
    hs = kw.get("hidden_states")
    if hs is None or hs.dim() != 3 or hs.shape[0] != 1:
        shape = None if hs is None else tuple(hs.shape)
        raise ValueError(
            f"forward_packed: request {i} hidden_states must be [1, S, C], got {shape}"
        )
    ehs = kw.get("encoder_hidden_states")
    if ehs is None or ehs.dim() != 3 or ehs.shape[0] != 1:
        shape = None if ehs is None else tuple(ehs.shape)
        raise ValueError(
            f"forward_packed: request {i} encoder_hidden_states must be [1, S_txt, D], got {shape}"
        )
    mask = kw.get("encoder_hidden_states_mask")
    if mask is not None and tuple(mask.shape) != (1, ehs.shape[1]):
        raise ValueError(
            f"forward_packed: request {i} encoder_hidden_states_mask shape {tuple(mask.shape)} "
            f"!= (1, {ehs.shape[1]})"
        )
    if kw.get("timestep") is None or kw["timestep"].numel() != 1:
        raise ValueError(f"forward_packed: request {i} needs a single timestep")
    if kw.get("img_shapes") is None:
        raise ValueError(f"forward_packed: request {i} needs img_shapes")


def per_row(fn, x: torch.Tensor) -> torch.Tensor:
    """Apply ``fn`` to each row of ``x [B, ...]`` separately and stack: per-request
    conditioning (timestep embedding, modulation) then does not depend on which other
    requests share the batch (BLAS picks different kernels for different small M)."""
    return torch.cat([fn(x[i : i + 1]) for i in range(x.shape[0])])


def _pad_to_min(x: torch.Tensor) -> torch.Tensor:
    if x.shape[0] >= MIN_ROWS:
        return x
    return torch.cat([x, x.new_zeros(MIN_ROWS - x.shape[0], *x.shape[1:])])


def _segment_ids(seg: torch.Tensor, lens: list[int], rows: int) -> torch.Tensor:
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


class QwenAdapter:
    """Handle returned by ``ditmem.patch`` for a ``QwenImageTransformer2DModel``."""

    def __init__(self, model, block_size: int = 64):
        if model.config.zero_cond_t or model.config.use_additional_t_cond:
            raise TypeError(
                "ditmem.patch: QwenImageTransformer2DModel with zero_cond_t or "
                "use_additional_t_cond (edit variants) is not supported"
            )
        if model.config.use_layer3d_rope:
            raise TypeError("ditmem.patch: use_layer3d_rope Qwen-Image models are not supported")
        self.model = model
        self.block_size = block_size
        self._original = dict(model.attn_processors)
        self._ours = {name: DitmemQwenAttnProcessor(block_size) for name in self._original}
        model.set_attn_processor(dict(self._ours))
        self.patched = True

    @property
    def num_blocks(self) -> int:
        return len(self.model.transformer_blocks)

    def unpatch(self) -> None:
        """Put the original processor objects back (idempotent)."""
        if self.patched:
            self.model.set_attn_processor(dict(self._original))
            self.patched = False

    def repatch(self) -> None:
        """Install ditmem's processors again after :meth:`unpatch` (idempotent)."""
        if not self.patched:
            self.model.set_attn_processor(dict(self._ours))
            self.patched = True

    def _require_patched(self) -> None:
        if not self.patched:
            raise RuntimeError("QwenAdapter: the model has been unpatched")

    @torch.no_grad()
    def prepare(self, kwargs_list: list[dict]) -> PackedBatch:
        """Embed inputs of batch-1 requests into a :class:`PackedBatch` (no blocks run)."""
        self._require_patched()
        if not kwargs_list:
            raise ValueError("forward_packed: kwargs_list is empty")
        m = self.model
        hs, txts, steps, img_lens, txt_lens, img_f, txt_f = [], [], [], [], [], [], []
        for i, kw in enumerate(kwargs_list):
            _check_kwargs(i, kw)
            ehs = kw["encoder_hidden_states"][0]
            mask = kw.get("encoder_hidden_states_mask")
            freqs_img, freqs_txt = m.pos_embed(
                kw["img_shapes"], max_txt_seq_len=ehs.shape[0], device=ehs.device
            )
            if mask is not None:
                valid = mask[0].to(torch.bool)
                ehs, freqs_txt = ehs[valid], freqs_txt[valid]
            hs.append(kw["hidden_states"][0])
            txts.append(ehs)
            steps.append(kw["timestep"].reshape(1))
            img_lens.append(hs[-1].shape[0])
            txt_lens.append(ehs.shape[0])
            img_f.append(freqs_img)
            txt_f.append(freqs_txt)
        img = m.img_in(_pad_to_min(torch.cat(hs)))
        txt = m.txt_in(m.txt_norm(_pad_to_min(torch.cat(txts))))
        timestep = torch.cat(steps).to(img.dtype)
        temb = per_row(lambda t: m.time_text_embed(t, img), timestep)
        device = img.device
        seg = torch.arange(len(kwargs_list), device=device)
        joint = PackedJoint.build(
            txt_lens, img_lens, torch.cat(txt_f), torch.cat(img_f), self.block_size, device
        )
        return PackedBatch(
            img=img,
            txt=txt,
            temb=temb,
            img_seg=_segment_ids(seg, img_lens, img.shape[0]),
            txt_seg=_segment_ids(seg, txt_lens, txt.shape[0]),
            img_lens=img_lens,
            joint=joint,
        )

    @torch.no_grad()
    def run_blocks(self, batch: PackedBatch, start: int, stop: int) -> None:
        """Run transformer blocks ``start..stop-1``; ``start`` must equal
        ``batch.blocks_done`` (blocks run in order, each once)."""
        self._require_patched()
        if start != batch.blocks_done or not start <= stop <= self.num_blocks:
            raise ValueError(
                f"run_blocks: range [{start}, {stop}) invalid; blocks_done={batch.blocks_done}, "
                f"num_blocks={self.num_blocks}"
            )
        for block in self.model.transformer_blocks[start:stop]:
            run_block(block, batch)
        batch.blocks_done = stop

    @torch.no_grad()
    def finish(self, batch: PackedBatch) -> list[torch.Tensor]:
        """Output norm and projection: per request ``[1, S_img_i, C_out]``."""
        if batch.blocks_done != self.num_blocks:
            raise ValueError(
                f"finish: only {batch.blocks_done} of {self.num_blocks} blocks have run"
            )
        m = self.model
        norm = m.norm_out
        emb = per_row(lambda t: norm.linear(norm.silu(t).to(batch.img.dtype)), batch.temb)
        scale, shift = emb.chunk(2, dim=1)
        x = norm.norm(batch.img) * (1 + scale[batch.img_seg]) + shift[batch.img_seg]
        out = m.proj_out(x)[: sum(batch.img_lens)]
        return [o.unsqueeze(0) for o in torch.split(out, batch.img_lens)]

    def forward_packed(self, kwargs_list: list[dict]) -> list[torch.Tensor]:
        """ONE forward over batch-1 requests; returns what the unpatched model returns for
        each: ``[1, S_img_i, C_out]`` (the ``sample`` of ``Transformer2DModelOutput``)."""
        batch = self.prepare(kwargs_list)
        self.run_blocks(batch, 0, self.num_blocks)
        return self.finish(batch)
