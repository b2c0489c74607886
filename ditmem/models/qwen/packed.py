"""Packed forward of a patched ``QwenImageTransformer2DModel``: several batch-1 requests
(different resolutions, text lengths, timesteps) in ONE pass.

Activations are packed token rows: image tokens ``[T_img, dim]`` and *valid* text tokens
``[T_txt, dim]`` of all requests back to back (masked text tokens never influence image
outputs, so they are dropped). Timestep modulation is computed per request ``[B, 6*dim]``
and reaches the rows through ``Segments`` (broadcast or a row gather). RoPE is
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

import torch

from ditmem.models.common.packing import pad_to_min, rowwise
from ditmem.models.common.processor_patch import ProcessorPatch
from ditmem.models.qwen.attention import DitmemQwenAttnProcessor, PackedJoint
from ditmem.models.qwen.blocks import (
    PackedBatch,
    Segments,
    run_block,
)

UNSUPPORTED_KWARGS = ("guidance", "controlnet_block_samples", "additional_t_cond")


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


def _check_boundary(boundary, img_lens: list[int], txt_lens: list[int]) -> None:
    for i, (b, n_img, n_txt) in enumerate(zip(boundary, img_lens, txt_lens, strict=True)):
        if b[0].shape[0] != n_img or b[1].shape[0] != n_txt:
            raise ValueError(
                f"prepare: boundary[{i}] has {b[0].shape[0]} image / {b[1].shape[0]} text rows, "
                f"request needs {n_img} / {n_txt}"
            )


class QwenAdapter(ProcessorPatch):
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
        original = dict(model.attn_processors)
        self._install(original, {name: DitmemQwenAttnProcessor(block_size) for name in original})

    @property
    def num_blocks(self) -> int:
        return len(self.model.transformer_blocks)

    def _require_patched(self) -> None:
        if not self.patched:
            raise RuntimeError("QwenAdapter: the model has been unpatched")

    @torch.no_grad()
    def prepare(
        self, kwargs_list: list[dict], boundary=None, start_block: int = 0
    ) -> PackedBatch:
        """Embed inputs of batch-1 requests into a :class:`PackedBatch` (no blocks run).

        To resume inside a step, pass ``boundary`` (per request, the ``(img, txt)`` rows
        that :meth:`PackedBatch.boundary` returned after ``start_block`` blocks) and
        ``start_block``; the kwargs still give shapes, masks, RoPE and timesteps.
        """
        self._require_patched()
        if not kwargs_list:
            raise ValueError("forward_packed: kwargs_list is empty")
        if boundary is not None and len(boundary) != len(kwargs_list):
            raise ValueError(
                f"prepare: boundary has {len(boundary)} entries for {len(kwargs_list)} requests"
            )
        if not 0 <= start_block <= self.num_blocks or (start_block > 0) != (boundary is not None):
            raise ValueError(
                f"prepare: start_block={start_block} needs boundary activations iff > 0 "
                f"(num_blocks={self.num_blocks})"
            )
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
        if boundary is None:
            img = m.img_in(pad_to_min(torch.cat(hs)))
            txt = m.txt_in(m.txt_norm(pad_to_min(torch.cat(txts))))
        else:
            _check_boundary(boundary, img_lens, txt_lens)
            img = pad_to_min(torch.cat([b[0] for b in boundary]))
            txt = pad_to_min(torch.cat([b[1] for b in boundary]))
        timestep = torch.cat(steps).to(img.dtype)
        tt = m.time_text_embed
        emb = tt.timestep_embedder
        layers = (emb.linear_1, emb.act, emb.linear_2, emb.post_act)
        temb = rowwise(
            [f for f in layers if f is not None], tt.time_proj(timestep).to(img.dtype)
        )
        device = img.device
        joint = PackedJoint.build(
            txt_lens, img_lens, torch.cat(txt_f), torch.cat(img_f), self.block_size, device
        )
        return PackedBatch(
            img=img,
            txt=txt,
            temb=temb,
            img_rows=Segments.build(img_lens, img.shape[0], device),
            txt_rows=Segments.build(txt_lens, txt.shape[0], device),
            img_lens=img_lens,
            txt_lens=txt_lens,
            joint=joint,
            blocks_done=start_block,
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
        emb = rowwise([norm.silu, norm.linear], batch.temb.to(batch.img.dtype))
        rows = batch.img_rows
        scale, shift = rows.expand(emb.unflatten(1, (2, -1)).transpose(0, 1))
        x = (rows.view(norm.norm(batch.img)) * (1 + scale) + shift).view_as(batch.img)
        out = m.proj_out(x)[: sum(batch.img_lens)]
        return [o.unsqueeze(0) for o in torch.split(out, batch.img_lens)]

    def forward_packed(self, kwargs_list: list[dict]) -> list[torch.Tensor]:
        """ONE forward over batch-1 requests; returns what the unpatched model returns for
        each: ``[1, S_img_i, C_out]`` (the ``sample`` of ``Transformer2DModelOutput``)."""
        batch = self.prepare(kwargs_list)
        self.run_blocks(batch, 0, self.num_blocks)
        return self.finish(batch)
