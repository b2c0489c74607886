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
    if not trim or wanted >= page_bytes:
        return page_bytes
    g = min(page_bytes & -page_bytes, 1 << (wanted.bit_length() - 1))
    return g if g >= MIN_GRANULE else page_bytes


def last_page_bytes(tensor) -> int:
    """Bytes of data in the last page of ``tensor`` (a PagedTensor with at least one row)."""
    rows_last = tensor.rows - (tensor.num_pages - 1) * tensor.rows_per_page
    return rows_last * (tensor.nbytes // tensor.rows)


def block_mapping(tensors, src: list[list[int]], dst: list[list[int]], page_bytes: int,
                  granule: int) -> torch.Tensor | None:
    """int64 ``[N, 2]`` of (src block, dst block) in ``granule``-byte blocks for moving each
    tensor's pages ``src[i]`` to ``dst[i]`` (page ``p`` = blocks ``p*k .. p*k+k-1``), the
    unused granules of each last page left out; ``None`` when there is nothing to copy."""
    k = page_bytes // granule
    s_ids: list[int] = []
    d_ids: list[int] = []
    if k == 1:
        for s, d in zip(src, dst, strict=True):
            s_ids += s
            d_ids += d
    else:
        for t, s, d in zip(tensors, src, dst, strict=True):
            if not s:
                continue
            for sp, dp in zip(s, d, strict=True):
                s_ids += range(sp * k, sp * k + k)
                d_ids += range(dp * k, dp * k + k)
            unused = k - -(-last_page_bytes(t) // granule)
            if unused:
                del s_ids[-unused:], d_ids[-unused:]
    if not s_ids:
        return None
    flat = [0] * (2 * len(s_ids))
    flat[0::2], flat[1::2] = s_ids, d_ids
    return torch.frombuffer(array("q", flat), dtype=torch.int64).view(-1, 2)


def block_view(arena: torch.Tensor, granule: int) -> torch.Tensor:
    """``arena`` (uint8 ``[num_pages, page_bytes]``, contiguous) as ``[num_pages * k,
    granule]`` without copying."""
    return arena.view(-1, granule)
