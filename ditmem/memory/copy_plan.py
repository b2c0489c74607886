"""Which bytes of which pages a transfer copies, grouped into ``copy_blocks`` calls.

A tensor's pages are full except maybe the last one. With ``trim`` the used part of each
last page is copied through a narrower view of the arenas (``arena[:, :nbytes]``), with
``nbytes`` rounded up to a power of two (at least ``MIN_TRIM_BYTES``) so that one call
covers many tails; without it every page is copied whole (one call). Each extra call has a
fixed cost (the op validates its inputs and dispatches), so a size class is folded into the
next larger one when keeping it apart would save fewer than ``min_saving`` bytes.
"""

from __future__ import annotations

from array import array

import torch

MIN_TRIM_BYTES = 4096
MIN_SAVING_BYTES = 512 << 10  # ~ the bytes one copy_blocks call's fixed cost would move


def size_class(nbytes: int, page_bytes: int) -> int:
    """``nbytes`` rounded up to a power of two >= MIN_TRIM_BYTES, capped at ``page_bytes``."""
    c = MIN_TRIM_BYTES
    while c < nbytes:
        c *= 2
    return min(c, page_bytes)


def last_page_bytes(tensor) -> int:
    """Bytes of data in the last page of ``tensor`` (a PagedTensor with at least one row)."""
    rows_last = tensor.rows - (tensor.num_pages - 1) * tensor.rows_per_page
    return rows_last * (tensor.nbytes // tensor.rows)


def plan_copies(tensors, src: list[list[int]], dst: list[list[int]], page_bytes: int,
                trim: bool, min_saving: int = MIN_SAVING_BYTES) -> list[tuple[int, torch.Tensor]]:
    """``[(bytes per page, mapping int64 [N, 2] of (src page, dst page))]``, one per call,
    largest first."""
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for t, s, d in zip(tensors, src, dst, strict=True):
        if not s:
            continue
        n_full = len(s)
        if trim:
            tail = size_class(last_page_bytes(t), page_bytes)
            if tail < page_bytes:
                n_full -= 1
                g = groups.setdefault(tail, ([], []))
                g[0].append(s[-1])
                g[1].append(d[-1])
        if n_full:
            g = groups.setdefault(page_bytes, ([], []))
            g[0].extend(s[:n_full])
            g[1].extend(d[:n_full])
    _fold_small_classes(groups, min_saving)
    return [(nbytes, _pairs(gs, gd)) for nbytes, (gs, gd) in sorted(groups.items(), reverse=True)]


def _pairs(src: list[int], dst: list[int]) -> torch.Tensor:
    """int64 [N, 2] of (src[i], dst[i]), built from a C array (two torch calls, no copy)."""
    flat = [0] * (2 * len(src))
    flat[0::2], flat[1::2] = src, dst
    return torch.frombuffer(array("q", flat), dtype=torch.int64).view(-1, 2)


def _fold_small_classes(groups: dict[int, tuple[list[int], list[int]]], min_saving: int):
    """Merge each class into the next larger one when it saves < ``min_saving`` bytes."""
    sizes = sorted(groups)
    for small, big in zip(sizes, sizes[1:], strict=False):
        pages = groups[small][0]
        if len(pages) * (big - small) < min_saving:
            gs, gd = groups.pop(small)
            groups[big][0].extend(gs)
            groups[big][1].extend(gd)


def run_copies(copy_blocks, src_arena: torch.Tensor, dst_arena: torch.Tensor,
               plan: list[tuple[int, torch.Tensor]]) -> None:
    """Issue the planned ``copy_blocks`` calls from ``src_arena`` into ``dst_arena``."""
    page_bytes = src_arena.shape[1]
    for nbytes, mapping in plan:
        if nbytes == page_bytes:
            copy_blocks(src_arena, dst_arena, mapping)
        else:
            copy_blocks(src_arena[:, :nbytes], dst_arena[:, :nbytes], mapping)
