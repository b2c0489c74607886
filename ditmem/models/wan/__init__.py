"""ditmem's adapter for diffusers' ``WanTransformer3DModel`` (Wan2.1 / Wan2.2 text-to-video).

    adapter = ditmem.models.wan.patch(transformer)     # or ditmem.patch(...)
    outs = adapter.forward_packed([
        {"hidden_states": x1, "timestep": t1, "encoder_hidden_states": e1},
        {"hidden_states": x2, "timestep": t2, "cross_kv": cache2},   # cached text K/V
    ])                                                 # -> [[1, C, F, H, W], ...]
    adapter.unpatch()                                  # the original processors are back

Patching swaps every ``attn1``/``attn2`` processor for ditmem's
(:mod:`ditmem.models.wan.attention`), so even the stock ``forward`` runs through
``ditmem.ops.paged_attention``; ``forward_packed`` runs one forward over many requests
(:mod:`ditmem.models.wan.packed`). Cross-attention K/V kept in pages:
:mod:`ditmem.models.wan.kv_cache`. Step-decomposed generation: :mod:`ditmem.models.wan.generate`.
"""

from __future__ import annotations

import torch

from ditmem.models.common.packing import pad_to_min
from ditmem.models.common.processor_patch import ProcessorPatch
from ditmem.models.wan import packed as wan_packed
from ditmem.models.wan.attention import WanCrossAttention, WanSelfAttention
from ditmem.models.wan.kv_cache import WanCrossKV, cached_text_kv, compute_cross_kv


class WanAdapter(ProcessorPatch):
    """A patched ``WanTransformer3DModel``. Attributes: ``model`` (the transformer),
    ``patched``. ``prepare`` / ``run_blocks`` / ``finish`` split a forward at block
    boundaries (``forward_packed`` runs all three)."""

    def __init__(self, model) -> None:
        for i, block in enumerate(model.blocks):
            if block.attn2.add_k_proj is not None:
                raise TypeError(f"ditmem.patch: block {i} has image K/V projections (Wan I2V); "
                                "only text-to-video Wan transformers are supported")
        original = dict(model.attn_processors)
        if any(isinstance(p, (WanSelfAttention, WanCrossAttention)) for p in original.values()):
            raise RuntimeError("ditmem.patch: the model is already patched; use its adapter "
                               "(or unpatch() it first)")
        self.model = model
        ours = {}
        for name in original:
            index = int(name.split(".")[1])
            ours[name] = WanSelfAttention() if ".attn1." in name else WanCrossAttention(index)
        self._install(original, ours)

    @property
    def num_blocks(self) -> int:
        """Transformer blocks of the model."""
        return len(self.model.blocks)

    def _check_patched(self, what: str) -> None:
        if not self.patched:
            raise RuntimeError(f"{what}: the adapter was unpatched; call repatch() first")

    @torch.no_grad()
    def forward_packed(self, requests: list[dict]) -> list[torch.Tensor]:
        """One forward over B requests; returns each request's ``[1, C, F, H, W]``.

        Each dict holds ``hidden_states [1, C, F, H, W]``, ``timestep`` ([1] or [1, S]) and
        either ``encoder_hidden_states [1, L, text_dim]`` or ``cross_kv`` (an attached
        :class:`WanCrossKV` of this transformer); all requests use the same kind.
        """
        batch = self.prepare(requests)
        self.run_blocks(batch, 0, self.num_blocks)
        return self.finish(batch)

    @torch.no_grad()
    def run_blocks(self, batch: wan_packed.PackedBatch, start: int, stop: int) -> None:
        """Run blocks ``start .. stop-1`` on a prepared batch; ``start`` must equal
        ``batch.blocks_done`` (blocks run in order, each once)."""
        self._check_patched("run_blocks")
        if start != batch.blocks_done or not start <= stop <= self.num_blocks:
            raise ValueError(f"start/stop: [{start}, {stop}) is not the next range; "
                             f"blocks_done={batch.blocks_done}, num_blocks={self.num_blocks}")
        wan_packed.run_blocks(self.model, batch, start, stop)
        batch.blocks_done = stop

    @torch.no_grad()
    def finish(self, batch: wan_packed.PackedBatch) -> list[torch.Tensor]:
        """Output norm, projection and unpatchify after all blocks: ``[1, C, F, H, W]`` each."""
        if batch.blocks_done != self.num_blocks:
            raise ValueError(f"batch: only {batch.blocks_done} of {self.num_blocks} blocks ran")
        return wan_packed.unembed(self.model, batch)

    @torch.no_grad()
    def prepare(self, requests: list[dict], boundary: list[torch.Tensor] | None = None,
                start_block: int = 0) -> wan_packed.PackedBatch:
        """Embed and condition ``requests`` (see :meth:`forward_packed`) without running any
        block. To resume a step paused after ``start_block`` blocks, pass ``boundary``: per
        request the hidden rows ``[S_b, dim]`` that ``PackedBatch.boundary()`` returned."""
        self._check_patched("forward_packed")
        if not requests:
            raise ValueError("requests: empty list (need at least one request)")
        if not 0 <= start_block <= self.num_blocks or (start_block > 0) != (boundary is not None):
            raise ValueError(f"start_block: {start_block} needs boundary activations iff > 0 "
                             f"(num_blocks={self.num_blocks})")
        if boundary is not None and len(boundary) != len(requests):
            raise ValueError(f"boundary: {len(boundary)} entries for {len(requests)} requests")
        for i, kw in enumerate(requests):
            missing = {"hidden_states", "timestep"} - kw.keys()
            if missing:
                raise ValueError(f"requests[{i}]: missing {sorted(missing)}")
        cached = ["cross_kv" in kw for kw in requests]
        if any(cached) and not all(cached):
            raise ValueError("requests: mix cross_kv and encoder_hidden_states in one call")
        if all(cached):
            batch = wan_packed.embed(self.model, requests, None)
            batch.attention.cached = cached_text_kv(self.model, [kw["cross_kv"] for kw in requests],
                                                    batch.layout.lengths)
        else:
            text = [kw.get("encoder_hidden_states") for kw in requests]
            for i, e in enumerate(text):
                if not isinstance(e, torch.Tensor) or e.dim() != 3 or e.shape[0] != 1:
                    shape = tuple(e.shape) if isinstance(e, torch.Tensor) else type(e).__name__
                    raise ValueError(f"requests[{i}]['encoder_hidden_states']: expected "
                                     f"[1, L, text_dim], got {shape}")
            batch = wan_packed.embed(self.model, requests, text)
        if boundary is not None:
            for i, (rows, n) in enumerate(zip(boundary, batch.layout.lengths, strict=True)):
                if tuple(rows.shape) != (n, batch.hidden.shape[2]):
                    raise ValueError(f"boundary[{i}]: shape {tuple(rows.shape)}, expected "
                                     f"({n}, {batch.hidden.shape[2]})")
            batch.hidden = pad_to_min(torch.cat(boundary).to(batch.hidden.dtype)).unsqueeze(0)
            batch.blocks_done = start_block
        return batch

    @torch.no_grad()
    def cache_cross_kv(self, encoder_hidden_states: torch.Tensor, pool) -> WanCrossKV | None:
        """Compute this transformer's text K/V of every layer once into pages of ``pool``
        (``None`` when the pool has no room). See :mod:`ditmem.models.wan.kv_cache`."""
        self._check_patched("cache_cross_kv")
        return compute_cross_kv(self.model, encoder_hidden_states, pool)


def patch(model) -> WanAdapter:
    """Patch a ``WanTransformer3DModel``; returns the :class:`WanAdapter`."""
    return WanAdapter(model)


def load(name_or_path: str, **kwargs):
    """The Wan generator: ``"tiny-wan"`` (embedded) or a local diffusers Wan folder.
    kwargs go to :class:`ditmem.models.wan.generate.WanGenerator`."""
    from ditmem.models.wan.generate import WanGenerator

    return WanGenerator.load(name_or_path, **kwargs)
