"""A free list of page ids with reference counts: O(1) per page, independent of pool size."""

from __future__ import annotations

from collections.abc import Sequence

from ditmem.memory.errors import DoubleFreeError


class FreeList:
    """Page ids ``0..num_pages-1``; each is free (count 0) or owned (count >= 1).

    ``take`` hands out the most recently freed pages first (a stack), so allocation cost
    does not depend on how many pages exist or how fragmented the pool is.
    """

    __slots__ = ("_free", "_refcount", "num_pages")

    def __init__(self, num_pages: int) -> None:
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))  # page 0 is handed out first
        self._refcount = [0] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int] | None:
        """``n`` free pages with count 1, or ``None`` when fewer than ``n`` are free."""
        if n < 0:
            raise ValueError(f"n: expected a non-negative page count, got {n}")
        free = self._free
        if n > len(free):
            return None
        if n == 0:
            return []
        pages = free[-n:]
        del free[-n:]
        pages.reverse()
        rc = self._refcount
        for p in pages:
            rc[p] = 1
        return pages

    def _check_ids(self, pages: Sequence[int]) -> None:
        if pages and (min(pages) < 0 or max(pages) >= self.num_pages):
            raise ValueError(f"pages: ids must lie in [0, {self.num_pages}), got "
                             f"min {min(pages)}, max {max(pages)}")

    def retain(self, pages: Sequence[int]) -> None:
        """Add one owner to each (owned) page."""
        self._check_ids(pages)
        rc = self._refcount
        if any(rc[p] == 0 for p in pages):
            bad = next(p for p in pages if rc[p] == 0)
            raise DoubleFreeError(f"retain: page {bad} is free")
        for p in pages:
            rc[p] += 1

    def release(self, pages: Sequence[int]) -> None:
        """Drop one owner of each page; pages with no owner left become free.

        All or nothing: if any page is already free (a double free) nothing changes.
        """
        self._check_ids(pages)
        rc = self._refcount
        freed: list[int] = []
        done = 0
        try:
            for p in pages:
                if rc[p] <= 0:
                    raise DoubleFreeError(f"free: page {p} is already free")
                rc[p] -= 1
                done += 1
                if rc[p] == 0:
                    freed.append(p)
        except DoubleFreeError:
            for p in pages[:done]:
                rc[p] += 1
            raise
        self._free.extend(freed)

    def refcount(self, page: int) -> int:
        """Owners of ``page`` (0 when free)."""
        self._check_ids([page])
        return self._refcount[page]
