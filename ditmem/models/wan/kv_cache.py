"""Wan cross-attention keys/values, computed once per request and kept in pages.

The text a request is conditioned on never changes across denoising steps, so neither do
the cross-attention keys ``norm_k(to_k(text_embedder(e)))`` and values ``to_v(...)`` of any
layer. :func:`compute_cross_kv` computes them once for every layer of one transformer.

Page layout (what ``ditmem.ops.paged_attention`` reads directly): the cache is a
``PagedTensor`` of rows ``[H, D]``; each of its pages holds the same ``tokens_per_page``
text tokens for a group of layers, as ``[layers_in_group, 2 (key, value), tokens_per_page,
H, D]``. Layer ``j`` of the group is then, over the whole arena, ``kernel_view()[:, rows]``
— a ``[num_pages, tokens_per_page, H, D]`` block pool whose blocks are contiguous — with
the tensor's page table as block table. A page normally holds all layers (one tensor per
request, transformer and CFG branch); when a page is too small for that, the layers are
split over several tensors (:func:`cross_kv_geometry`).

``detach()`` hands the cache's tensors to the engine for offloading and forbids reads
until ``attach()`` (after they are restored, in whatever pages they landed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ditmem.memory import PagedTensor, TensorState, rows_per_page
from ditmem.models.wan.attention import CachedTextKV, text_kv
from ditmem.ops.plan import AttentionPlan

SUB_BLOCK = 64  # kernel block size inside a page, when the page layout allows it


@dataclass(slots=True, frozen=True)
class CrossKVGeometry:
    """How a transformer's text K/V fill pages: ``groups`` (first layer, layer count) per
    tensor, ``tokens_per_page``, ``rows_per_page`` (rows of ``[H, D]``) and the kernel's
    ``block_size``: ``tokens_per_page`` (a block is a layer's slice of one page), or
    :data:`SUB_BLOCK` when pages hold exactly ``rows_per_page`` rows and both counts are
    multiples of it (then the arena is read as blocks of 64 rows: big pages do not turn
    into big kernel blocks)."""

    groups: tuple[tuple[int, int], ...]
    tokens_per_page: int
    rows_per_page: int
    block_size: int

    def pages(self, text_len: int) -> int:
        """Pages one request branch needs for ``text_len`` text tokens (all groups)."""
        return len(self.groups) * -(-text_len // self.tokens_per_page)


def cross_kv_geometry(num_layers: int, heads: int, head_dim: int, dtype: torch.dtype,
                      page_bytes: int) -> CrossKVGeometry:
    """Pure arithmetic: the page geometry of a ``num_layers``-layer cache of ``dtype``.

    Puts as many layers in one page as fit with at least ``min(64, rows // 2)`` tokens each.
    """
    row = heads * head_dim * dtype.itemsize
    if page_bytes < 2 * row:
        raise ValueError(f"page_bytes: {page_bytes} cannot hold one key and one value row of "
                         f"[{heads}, {head_dim}] {dtype} ({2 * row} bytes); for a byte count "
                         "independent of pages use the generator's state_bytes()")
    rpp = rows_per_page((heads, head_dim), dtype, page_bytes)
    per_group = max(1, min(num_layers, rpp // (2 * min(64, rpp // 2))))
    tokens = rpp // (2 * per_group)
    groups = tuple((s, min(per_group, num_layers - s)) for s in range(0, num_layers, per_group))
    block = tokens
    if page_bytes == rpp * row and rpp % SUB_BLOCK == 0 and tokens > SUB_BLOCK:
        tokens = tokens // SUB_BLOCK * SUB_BLOCK
        block = SUB_BLOCK
    return CrossKVGeometry(groups, tokens, rpp, block)


def geometry_of(model, page_bytes: int) -> CrossKVGeometry:
    """:func:`cross_kv_geometry` for a ``WanTransformer3DModel`` in its own dtype."""
    cfg = model.config
    return cross_kv_geometry(cfg.num_layers, cfg.num_attention_heads, cfg.attention_head_dim,
                             model.proj_out.weight.dtype, page_bytes)


class WanCrossKV:
    """One request's cached text K/V for one transformer (``owner``) and one CFG branch.

    tensors: one ``PagedTensor`` of rows ``[H, D]`` per layer group; geometry: their layout;
    text_len: text tokens L.
    """

    __slots__ = ("tensors", "geometry", "text_len", "owner", "attached")

    def __init__(self, tensors: list[PagedTensor], geometry: CrossKVGeometry, text_len: int,
                 owner) -> None:
        self.tensors = tensors
        self.geometry = geometry
        self.text_len = text_len
        self.owner = owner
        self.attached = True

    def detach(self) -> list[PagedTensor]:
        """Stop using the cache (so its pages may be offloaded); returns its tensors."""
        self.attached = False
        return list(self.tensors)

    def attach(self) -> None:
        """Use the cache again; its tensors must be back in device pages."""
        for t in self.tensors:
            if t.state is not TensorState.ON_DEVICE:
                raise RuntimeError(f"attach: cross-attention K/V tensor is {t.state.value}; "
                                   "restore it first")
        self.attached = True

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the keys and values, each ``[num_layers, L, H, D]`` (tests, inspection)."""
        geo, keys, values = self.geometry, [], []
        for t, (_, count) in zip(self.tensors, geo.groups, strict=True):
            pages = t.read().unflatten(0, (-1, geo.rows_per_page))
            used = pages[:, : 2 * count * geo.tokens_per_page]
            kv = used.unflatten(1, (count, 2, geo.tokens_per_page)).permute(1, 2, 0, 3, 4, 5)
            kv = kv.flatten(2, 3)[:, :, : self.text_len]  # [count, 2, L, H, D]
            keys.append(kv[:, 0])
            values.append(kv[:, 1])
        return torch.cat(keys), torch.cat(values)

    def free(self) -> None:
        """Release the pages."""
        for t in self.tensors:
            t.free()


def compute_cross_kv(model, encoder_hidden_states: torch.Tensor, pool) -> WanCrossKV | None:
    """Text K/V of every layer of ``model`` for ``encoder_hidden_states [1, L, text_dim]``
    (the pipeline's padded prompt embeddings), written to pages of ``pool`` in the model's
    dtype. Returns ``None`` (nothing left allocated) when the pool has no room."""
    if encoder_hidden_states.dim() != 3 or encoder_hidden_states.shape[0] != 1:
        raise ValueError("encoder_hidden_states: expected [1, L, text_dim], got "
                         f"{tuple(encoder_hidden_states.shape)}")
    dtype = model.proj_out.weight.dtype
    geo = geometry_of(model, pool.page_bytes)
    text = model.condition_embedder.text_embedder(encoder_hidden_states.to(dtype))[0]
    length, tpp, rpp = text.shape[0], geo.tokens_per_page, geo.rows_per_page
    num_pages = -(-length // tpp)
    tensors = []
    for first, count in geo.groups:
        tensor = pool.allocate_tensor(num_pages * rpp, _row_shape(model), dtype)
        if tensor is None:
            for t in tensors:
                t.free()
            return None
        tensors.append(tensor)
        pages = text.new_zeros(num_pages, rpp, *_row_shape(model))
        for j in range(count):
            key, value = text_kv(model.blocks[first + j].attn2, text)
            for c, x in enumerate((key, value)):
                padded = torch.cat([x, x.new_zeros(num_pages * tpp - length, *x.shape[1:])])
                lo = (2 * j + c) * tpp
                pages[:, lo : lo + tpp] = padded.unflatten(0, (num_pages, tpp))
        tensor.write(pages.flatten(0, 1))
    return WanCrossKV(tensors, geo, length, model)


def _row_shape(model) -> tuple[int, int]:
    return (model.config.num_attention_heads, model.config.attention_head_dim)


def cached_text_kv(model, caches: list[WanCrossKV], q_lens: list[int],
                   heads: slice | None = None) -> CachedTextKV:
    """Per-layer block pools of B requests' caches (one per packed segment, in order) and
    the attention plans of the packed queries (``q_lens[b]`` rows of request b) over them,
    built from the page lists on the host (one plan per page group, no device read). All
    caches must be attached, belong to ``model`` and live in one pool.

    ``heads`` (a sequence-parallel rank's head range): instead of views of the whole
    arena, contiguous copies of only the blocks the requests read, for those heads only,
    with the block tables renumbered (``CachedTextKV.heads`` says so); a head-sliced view
    of the arena would make the kernel copy the whole arena at every layer."""
    for i, c in enumerate(caches):
        if not isinstance(c, WanCrossKV):
            raise ValueError(f"requests[{i}]['cross_kv']: expected a WanCrossKV, got "
                             f"{type(c).__name__}")
        if c.owner is not model:
            raise ValueError(f"requests[{i}]['cross_kv']: computed by another transformer")
        if not c.attached:
            raise ValueError(f"requests[{i}]['cross_kv']: detached (offloaded); attach() it "
                             "after restoring")
        if c.tensors[0].pool is not caches[0].tensors[0].pool:
            raise ValueError(f"requests[{i}]['cross_kv']: lives in another page pool")
    geo = caches[0].geometry
    kv_lens = [c.text_len for c in caches]
    views = []
    for g, (_, count) in enumerate(geo.groups):
        arena = caches[0].tensors[g].kernel_view()  # [num_pages, rows_per_page, H, D]
        pools = [_layer_pools(arena, geo, j, count) for j in range(count)]
        tables = [_blocks(c.tensors[g].pages, geo) for c in caches]
        if heads is not None:
            used = [t[: -(-n // geo.block_size)] for t, n in zip(tables, kv_lens, strict=True)]
            ids = sorted({b for t in used for b in t})
            renumber = {b: i for i, b in enumerate(ids)}
            tables = [[renumber[b] for b in t] for t in used]
            index = torch.tensor(ids, dtype=torch.int64, device=arena.device)
            pools = [(k.index_select(0, index)[:, :, heads].contiguous(),
                      v.index_select(0, index)[:, :, heads].contiguous()) for k, v in pools]
        plan = AttentionPlan.build(
            q_lens=q_lens, kv_lens=kv_lens, block_size=geo.block_size, block_tables=tables,
            num_blocks=pools[0][0].shape[0], device=arena.device)
        views += [(k, v, plan) for k, v in pools]
    return CachedTextKV(views, heads)


def _blocks(pages: list[int], geo: CrossKVGeometry) -> list[int]:
    """A request's blocks in token order. With page blocks they are its pages; with
    sub-blocks, page ``p`` holds blocks ``p * per_page + i`` (``i < tokens_per_page /
    block_size``) of the arena read as 64-row blocks."""
    per_token_page = geo.tokens_per_page // geo.block_size
    if per_token_page == 1:
        return pages
    per_page = geo.rows_per_page // geo.block_size
    return [p * per_page + i for p in pages for i in range(per_token_page)]


def _layer_pools(arena: torch.Tensor, geo: CrossKVGeometry, j: int, count: int):
    """Key and value block pools of the group's layer ``j`` (same shape, same block ids)."""
    tpp, bs = geo.tokens_per_page, geo.block_size
    if bs == tpp:  # one block per page: slice the layer's rows out of every page
        lo = 2 * j * tpp
        return arena[:, lo : lo + tpp], arena[:, lo + tpp : lo + 2 * tpp]
    # Pages are contiguous and hold exactly rows_per_page rows: the arena is a pool of
    # 64-row blocks. Layer j's keys of page-block i sit 2*j*tpp/bs blocks after the page's
    # first block, its values tpp/bs blocks later; shifting the pool by that offset lets
    # both use the same table.
    blocks = arena.view(-1, bs, *arena.shape[2:])
    shift = tpp // bs
    span = blocks.shape[0] - (2 * count - 1) * shift
    k_off, v_off = 2 * j * shift, (2 * j + 1) * shift
    return blocks[k_off : k_off + span], blocks[v_off : v_off + span]
