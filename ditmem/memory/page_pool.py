"""The device-side page pool: allocation returns pages or ``None``; it never picks a victim."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ditmem.memory.accounting import normalize_row_shape, pages_for
from ditmem.memory.arena import PageArena


@dataclass(slots=True, frozen=True)
class PoolStats:
    """Plain numbers the engine hands to the scheduler (no objects, no torch)."""

    num_pages: int
    num_free_pages: int
    watermark_pages: int
    page_bytes: int

    @property
    def headroom_pages(self) -> int:
        """Free pages above the watermark (0 when at or below it)."""
        return max(0, self.num_free_pages - self.watermark_pages)


class PagePool(PageArena):
    """Pages of one device arena ``uint8 [num_pages, page_bytes]``.

    ``allocate(n)`` returns ``n`` page ids or ``None`` when fewer are free: running out is a
    normal event and the caller (the scheduler) decides who yields. ``watermark`` (a fraction
    of the pages) is headroom the scheduler should keep free for restores and growth; the pool
    only reports it (``watermark_pages``, ``headroom_pages``) and enforces it when asked
    (``can_allocate(n, keep_watermark=True)``).
    """

    def __init__(self, num_pages: int, page_bytes: int = 256 << 10, device="cpu", *,
                 watermark: float = 0.0, prefault: bool = True) -> None:
        super().__init__(num_pages, page_bytes, device, prefault=prefault)
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark: expected a fraction in [0, 1), got {watermark}")
        self.watermark_pages = math.ceil(watermark * num_pages)

    @property
    def headroom_pages(self) -> int:
        """Free pages above the watermark (0 when at or below it)."""
        return max(0, self.num_free_pages - self.watermark_pages)

    def can_allocate(self, n: int, *, keep_watermark: bool = False) -> bool:
        """Whether ``n`` pages are free (and, if asked, the watermark stays free too)."""
        keep = self.watermark_pages if keep_watermark else 0
        return n + keep <= self.num_free_pages

    def allocate(self, n: int) -> list[int] | None:
        """``n`` page ids, each with one reference, or ``None`` if fewer than ``n`` are free."""
        return self._take(n)

    def pages_for(self, rows: int, row_shape, dtype) -> int:
        """Pages a ``[rows, *row_shape]`` tensor of ``dtype`` needs in this pool."""
        return pages_for(rows, row_shape, dtype, self.page_bytes)

    def allocate_tensor(self, rows: int, row_shape=(), dtype: torch.dtype = torch.float32):
        """A ``PagedTensor [rows, *row_shape]`` of ``dtype`` in fresh pages, or ``None``.

        Contents are uninitialised. ``ValueError`` if one row does not fit in a page.
        """
        from ditmem.memory.paged_tensor import PagedTensor

        row_shape = normalize_row_shape(row_shape)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype: expected a torch.dtype, got {dtype!r}")
        pages = self.allocate(self.pages_for(rows, row_shape, dtype))
        if pages is None:
            return None
        return PagedTensor(self, pages, rows, row_shape, dtype)

    def stats(self) -> PoolStats:
        """A snapshot of the pool's counters."""
        return PoolStats(self.num_pages, self.num_free_pages, self.watermark_pages,
                         self.page_bytes)

    def __repr__(self) -> str:
        return (f"PagePool(num_pages={self.num_pages}, page_bytes={self.page_bytes}, "
                f"device={self.device}, free={self.num_free_pages})")
