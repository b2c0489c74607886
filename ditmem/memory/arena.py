"""A byte arena cut into pages, plus its free list.

Shared by the device-side ``PagePool`` (one tensor ``uint8 [num_pages, page_bytes]``) and
the host-side ``HostPool`` (the same, or several chunks of consecutive pages, so a large
pinned pool is not one huge pinned allocation); they also differ in what running out of
pages means (``None`` versus an exception).
"""

from __future__ import annotations

import torch

from ditmem.memory.accounting import normalize_row_shape, row_bytes, rows_per_page
from ditmem.memory.free_list import FreeList

PAGE_ALIGN = 16  # bytes; every page starts at a multiple of this, so any dtype view is aligned


class PageArena:
    """Fixed-size pages of one preallocated byte tensor.

    ``arena`` is ``uint8 [num_pages, page_bytes]`` on ``device``. Pages are identified by
    their row index in it. Allocation is O(1) per page and never moves data. A CPU arena is
    touched once at creation (``prefault``) so that no copy pays for first-touch page faults;
    pinned and device memory are resident already.
    """

    def __init__(self, num_pages: int, page_bytes: int, device, *, pin_memory: bool = False,
                 prefault: bool = True, chunk_pages: int | None = None):
        if not isinstance(num_pages, int) or isinstance(num_pages, bool) or num_pages <= 0:
            raise ValueError(f"num_pages: expected a positive int, got {num_pages!r}")
        if (not isinstance(page_bytes, int) or isinstance(page_bytes, bool) or page_bytes <= 0
                or page_bytes % PAGE_ALIGN):
            raise ValueError(
                f"page_bytes: expected a positive multiple of {PAGE_ALIGN}, got {page_bytes!r}")
        if chunk_pages is not None and (not isinstance(chunk_pages, int) or chunk_pages <= 0):
            raise ValueError(f"chunk_pages: expected a positive int, got {chunk_pages!r}")
        self.device = torch.device(device)
        self.page_bytes = page_bytes
        #: pages per chunk: page p is row p % chunk_pages of chunks[p // chunk_pages]
        self.chunk_pages = min(num_pages, chunk_pages or num_pages)
        self.chunks = [
            torch.empty((min(self.chunk_pages, num_pages - first), page_bytes), dtype=torch.uint8,
                        device=self.device, pin_memory=pin_memory)
            for first in range(0, num_pages, self.chunk_pages)]
        if prefault and self.device.type == "cpu" and not pin_memory:
            # CPU memory is mapped lazily: touch it now, not on the first copy into a page
            for chunk in self.chunks:
                chunk.zero_()
        self._pages = FreeList(num_pages)

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    @property
    def arena(self) -> torch.Tensor:
        """The arena ``uint8 [num_pages, page_bytes]`` (single-chunk arenas only)."""
        if len(self.chunks) != 1:
            raise ValueError(f"arena: this arena has {len(self.chunks)} chunks; use chunks / "
                             "page_rows")
        return self.chunks[0]

    def page_rows(self, pages, dtype: torch.dtype, row_shape=()) -> torch.Tensor:
        """A copy of ``pages`` (any chunks) as ``[len(pages), rows_per_page, *row_shape]``."""
        row_shape = normalize_row_shape(row_shape)
        rpp = rows_per_page(row_shape, dtype, self.page_bytes)
        used = rpp * row_bytes(row_shape, dtype)
        n = self.chunk_pages
        raw = torch.stack([self.chunks[p // n][p % n, :used] for p in pages]) if pages else \
            self.chunks[0].new_empty((0, used))
        return raw.view(dtype).view(len(pages), rpp, *row_shape)

    @property
    def num_pages(self) -> int:
        return self._pages.num_pages

    @property
    def num_free_pages(self) -> int:
        return self._pages.num_free

    @property
    def num_used_pages(self) -> int:
        return self._pages.num_pages - self._pages.num_free

    @property
    def is_pinned(self) -> bool:
        return self.device.type == "cpu" and self.chunks[0].is_pinned()

    def can_allocate(self, n: int) -> bool:
        """Whether ``n`` pages are free right now."""
        return n <= self._pages.num_free

    def free(self, pages) -> None:
        """Drop one reference to each page; unreferenced pages become free (all or nothing).

        Raises ``DoubleFreeError`` (nothing changed) if a page is already free.
        """
        self._pages.release(list(pages))

    def retain(self, pages) -> None:
        """Add a reference to each owned page (shared pages are freed by their last owner)."""
        self._pages.retain(list(pages))

    def refcount(self, page: int) -> int:
        """References held on ``page`` (0 when it is free)."""
        return self._pages.refcount(page)

    def view(self, dtype: torch.dtype, row_shape=()) -> torch.Tensor:
        """Zero-copy view of the whole arena as ``[num_pages, rows_per_page, *row_shape]``.

        Rows never straddle pages; bytes past the last whole row of a page are not covered.
        """
        row_shape = normalize_row_shape(row_shape)
        rpp = rows_per_page(row_shape, dtype, self.page_bytes)
        row_elems = row_bytes(row_shape, dtype) // dtype.itemsize
        flat = self.arena.view(dtype)  # [num_pages, page_bytes // itemsize]
        return flat[:, : rpp * row_elems].view(self.num_pages, rpp, *row_shape)

    def _take(self, n: int) -> list[int] | None:
        return self._pages.take(n)
