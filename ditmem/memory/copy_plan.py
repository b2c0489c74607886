"""Which bytes of which pages a transfer copies: one ``copy_blocks`` mapping per transfer.

The arenas are copied through a view ``uint8 [num_pages * k, granule]`` (``k = page_bytes //
granule``, a reshape of the contiguous arena: no copy, no strides), so page ``p`` is blocks
``p*k .. p*k + k-1``. A tensor's pages are full except maybe the last one; with trimming
only the granules of the last page that hold data are copied, so every tensor moves its
bytes rounded up to one granule, all in one call (one validation, one dispatch). Without
trimming the granule is the page (one block per page).
"""

from __future__ import annotations

from array import array

import torch

TRIM_GRANULE = 64 << 10  # bytes; at most one granule per tensor is copied needlessly
MIN_GRANULE = 4096  # finer granules make mappings long for little saving


def granule_for(page_bytes: int, trim: bool, wanted: int = TRIM_GRANULE) -> int:
    """Bytes per copied block: ``page_bytes`` without trimming, else the largest power of two
    <= ``wanted`` that divides ``page_bytes`` (``page_bytes`` if that is < MIN_GRANULE)."""
    if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted <= 0:
        raise ValueError(f"trim_granule: expected a positive int, got {wanted!r}")
    if not trim or wanted >= page_bytes:
        return page_bytes
    g = min(page_bytes & -page_bytes, 1 << (wanted.bit_length() - 1))
    return g if g >= MIN_GRANULE else page_bytes


def block_ids(tensors, src: list[list[int]], dst: list[list[int]], page_bytes: int,
              granule: int) -> tuple[list[int], list[int]]:
    """(src blocks, dst blocks) in ``granule``-byte blocks for moving each tensor's pages
    ``src[i]`` to ``dst[i]`` (page ``p`` = blocks ``p*k .. p*k+k-1``), leaving out the
    granules of each last page past ``tensor.last_page_bytes``."""
    k = page_bytes // granule
    s_pages: list[int] = []
    d_pages: list[int] = []
    if k == 1:
        for s, d in zip(src, dst, strict=True):
            s_pages += s
            d_pages += d
        return s_pages, d_pages
    cuts = []  # (end of a tensor's blocks, unused granules of its last page)
    for t, s, d in zip(tensors, src, dst, strict=True):
        if s:
            s_pages += s
            d_pages += d
            unused = k + t.last_page_bytes // -granule
            if unused:
                cuts.append((len(s_pages) * k, unused))
    ks = range(k)
    s_ids = [p * k + j for p in s_pages for j in ks]
    d_ids = [p * k + j for p in d_pages for j in ks]
    for end, unused in reversed(cuts):
        del s_ids[end - unused : end], d_ids[end - unused : end]
    return s_ids, d_ids


def pairs(s_ids: list[int], d_ids: list[int]) -> torch.Tensor:
    """int64 ``[N, 2]`` of (s_ids[i], d_ids[i]) in fresh host memory."""
    flat = [0] * (2 * len(s_ids))
    flat[0::2], flat[1::2] = s_ids, d_ids
    return torch.frombuffer(array("q", flat), dtype=torch.int64).view(-1, 2)


class MappingBuffer:
    """Reusable host storage for mappings: ``fill`` writes (src, dst) pairs into it and returns
    an int64 ``[N, 2]`` view of its first N rows (one view kept per N, so a repeated transfer
    makes no torch call), or ``None`` when N exceeds ``capacity``.

    The caller must not fill it again while a copy may still read the previous mapping.
    """

    __slots__ = ("capacity", "_data", "_words", "_views")
    MAX_VIEWS = 64

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._data = torch.zeros(capacity, 2, dtype=torch.int64)
        self._words = memoryview(self._data.numpy()).cast("B").cast("q")
        self._views: dict[int, torch.Tensor] = {}

    def fill(self, s_ids: list[int], d_ids: list[int]) -> torch.Tensor | None:
        n = len(s_ids)
        if n > self.capacity or len(d_ids) != n:
            return None
        view = self._views.get(n)
        if view is None:
            view = self._data[:n]
            if len(self._views) < self.MAX_VIEWS:
                self._views[n] = view
        self._words[0 : 2 * n : 2] = array("q", s_ids)
        self._words[1 : 2 * n : 2] = array("q", d_ids)
        return view


def block_view(arena: torch.Tensor, granule: int) -> torch.Tensor:
    """``arena`` (uint8 ``[num_pages, page_bytes]``, contiguous) as ``[num_pages * k,
    granule]`` without copying."""
    return arena.view(-1, granule)
