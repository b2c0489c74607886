"""A logical tensor ``[rows, *row_shape]`` whose rows live in pages of a pool."""

from __future__ import annotations

import enum

import torch

from ditmem.memory.accounting import rows_per_page
from ditmem.memory.errors import DoubleFreeError, TensorFreedError, TensorStateError


class TensorState(enum.Enum):
    ON_DEVICE = "on_device"      # data in device pages; read/write/kernels allowed
    OFFLOADING = "offloading"    # device -> host copy in flight; hands off
    ON_HOST = "on_host"          # data in host pages; device pages released
    RESTORING = "restoring"      # host -> device copy in flight; hands off
    FREED = "freed"              # pages released; every use raises TensorFreedError


class PagedTensor:
    """Rows ``[rows, *row_shape]`` of ``dtype`` stored ``rows_per_page`` to a page.

    Row ``r`` lives in page ``pages[r // rows_per_page]`` at slot ``r % rows_per_page``.
    ``page_table`` (int32, on the pool's device) and ``kernel_view()`` (the whole arena as
    ``[pool.num_pages, rows_per_page, *row_shape]``, zero-copy) are what ``ditmem.ops``
    kernels take as ``block_table`` and cache. Created by ``PagePool.allocate_tensor``; moved
    by ``OffloadEngine``.
    """

    __slots__ = ("pool", "rows", "row_shape", "dtype", "rows_per_page", "last_page_bytes",
                 "_state", "_pages", "_page_table", "_host", "_host_pages", "_view")

    def __init__(self, pool, pages: list[int], rows: int, row_shape: tuple[int, ...],
                 dtype: torch.dtype) -> None:
        self.pool = pool
        self.rows = rows
        self.row_shape = row_shape
        self.dtype = dtype
        self.rows_per_page = rows_per_page(row_shape, dtype, pool.page_bytes)
        # bytes of data in the last page (0 without rows); transfers copy only those
        self.last_page_bytes = (rows - (self.num_pages - 1) * self.rows_per_page) * (
            self.nbytes // rows) if rows else 0
        self._state = TensorState.ON_DEVICE
        self._host = None
        self._host_pages: list[int] = []
        self._view = None
        self._set_device_pages(pages)

    # ----------------------------------------------------------------- properties
    @property
    def state(self) -> TensorState:
        return self._state

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.rows, *self.row_shape)

    @property
    def num_pages(self) -> int:
        """Pages this tensor occupies wherever it currently lives."""
        return -(-self.rows // self.rows_per_page)

    @property
    def nbytes(self) -> int:
        """Bytes of data (not of pages)."""
        n = self.rows * self.dtype.itemsize
        for d in self.row_shape:
            n *= d
        return n

    @property
    def pages(self) -> list[int]:
        """Device page ids in row order (a copy); empty unless on the device."""
        self._check_alive()
        return list(self._pages)

    @property
    def host_pages(self) -> list[int]:
        """Host page ids in row order (a copy); empty unless on the host."""
        self._check_alive()
        return list(self._host_pages)

    @property
    def page_table(self) -> torch.Tensor:
        """int32 ``[num_pages]`` on the pool's device; only valid while on the device."""
        self._check_state(TensorState.ON_DEVICE, "page_table")
        if self._page_table is None:  # built on first use: moves do not pay for it
            self._page_table = torch.tensor(self._pages, dtype=torch.int32,
                                            device=self.pool.device)
        return self._page_table

    def kernel_view(self) -> torch.Tensor:
        """The pool arena as ``[pool.num_pages, rows_per_page, *row_shape]`` of ``dtype``.

        Zero-copy: index it with ``page_table`` (rows past ``rows`` in the last page are
        not this tensor's data).
        """
        self._check_state(TensorState.ON_DEVICE, "kernel_view")
        if self._view is None:
            self._view = self.pool.view(self.dtype, self.row_shape)
        return self._view

    # ----------------------------------------------------------------- data
    def write(self, x: torch.Tensor, offset: int = 0) -> None:
        """Store ``x [n, *row_shape]`` (same dtype) into rows ``offset .. offset+n``."""
        self._check_state(TensorState.ON_DEVICE, "write")
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype != self.dtype:
            raise ValueError(f"x: dtype {x.dtype} does not match the tensor's {self.dtype}")
        if x.dim() != 1 + len(self.row_shape) or tuple(x.shape[1:]) != self.row_shape:
            raise ValueError(f"x: shape {tuple(x.shape)} is not [n, *{self.row_shape}]")
        n = x.shape[0]
        if not isinstance(offset, int) or offset < 0 or offset + n > self.rows:
            raise ValueError(f"offset: rows {offset}..{offset + n} of x {tuple(x.shape)} do not "
                             f"fit in {self.rows} rows")
        if n:
            _write_rows(self.kernel_view(), self._pages, self.page_table,
                        x.to(self.pool.device), offset, self.rows_per_page)

    def read(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """A copy of rows ``start .. stop`` as ``[stop - start, *row_shape]``.

        On the device it is a tensor on the pool's device; while offloaded (``ON_HOST``) it is
        read from the host pages and returned on the CPU.
        """
        self._check_alive()
        stop = self.rows if stop is None else stop
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop
                <= self.rows):
            raise ValueError(f"start/stop: {start}..{stop} is not a row range of {self.rows} rows")
        if self._state is TensorState.ON_DEVICE:
            view, table = self.kernel_view(), self.page_table
        elif self._state is TensorState.ON_HOST:
            view = self._host.page_rows(self._host_pages, self.dtype, self.row_shape)
            table = torch.arange(len(self._host_pages))
        else:
            raise TensorStateError(f"read: tensor is {self._state.value}; finish or cancel "
                                   "the transfer first")
        return _read_rows(view, table, start, stop, self.rows_per_page)

    def free(self) -> None:
        """Release the tensor's pages (device or host). Not allowed while in flight."""
        if self._state is TensorState.FREED:
            raise DoubleFreeError("free: PagedTensor already freed")
        if self._state in (TensorState.OFFLOADING, TensorState.RESTORING):
            raise TensorStateError(f"free: tensor is {self._state.value}; cancel or finish the "
                                   "transfer first")
        if self._state is TensorState.ON_DEVICE:
            self.pool.free(self._pages)
        else:
            self._host.free(self._host_pages)
        self._pages, self._host_pages, self._host = [], [], None
        self._page_table = None
        self._view = None
        self._state = TensorState.FREED

    # ------------------------------------------- transitions (used by OffloadEngine)
    def _set_device_pages(self, pages: list[int]) -> None:
        self._pages = pages
        self._page_table = None

    def _begin(self, state: TensorState) -> None:
        self._state = state

    def _land_on_host(self, host, host_pages: list[int]) -> None:
        self._host, self._host_pages = host, host_pages
        self._pages, self._page_table, self._view = [], None, None
        self._state = TensorState.ON_HOST

    def _land_on_device(self, pages: list[int]) -> None:
        self._host, self._host_pages = None, []
        self._set_device_pages(pages)
        self._state = TensorState.ON_DEVICE

    # ----------------------------------------------------------------- checks
    def _check_alive(self) -> None:
        if self._state is TensorState.FREED:
            raise TensorFreedError("PagedTensor used after free()")

    def _check_state(self, wanted: TensorState, what: str) -> None:
        self._check_alive()
        if self._state is not wanted:
            raise TensorStateError(f"{what}: tensor is {self._state.value}, needs "
                                   f"{wanted.value}")

    def __repr__(self) -> str:
        return (f"PagedTensor(shape={self.shape}, dtype={self.dtype}, state={self._state.value}, "
                f"pages={self.num_pages})")


def _write_rows(view, pages, table, x, start, rpp) -> None:
    """view[pages[r // rpp], r % rpp] = x[r - start] for r in [start, start + len(x)).

    ``table`` is ``pages`` as a tensor on the view's device (no host sync needed).
    """
    stop = start + x.shape[0]
    pos = start
    if pos % rpp:  # partial first page
        hi = min(stop, (pos // rpp + 1) * rpp)
        lo = pos % rpp
        view[pages[pos // rpp]][lo : lo + hi - pos].copy_(x[: hi - pos])
        pos = hi
    full = (stop - pos) // rpp
    if full:
        p0 = pos // rpp
        src = x[pos - start : pos - start + full * rpp].reshape(full, rpp, *x.shape[1:])
        if full == 1 or (view.device.type == "cpu" and src[0].nbytes >= 4096):
            # on the CPU one memcpy per page beats index_copy_ (4-5x for bfloat16)
            for i in range(full):
                view[pages[p0 + i]].copy_(src[i])
        else:  # one kernel launch on an accelerator
            view.index_copy_(0, table[p0 : p0 + full].long(), src)
        pos += full * rpp
    if pos < stop:  # partial last page
        view[pages[pos // rpp]][: stop - pos].copy_(x[pos - start :])


def _read_rows(view, table, start, stop, rpp) -> torch.Tensor:
    """Rows [start, stop) gathered from the pages ``table`` of ``view``."""
    if start == stop:
        return view.new_empty((0, *view.shape[2:]))
    p0, p1 = start // rpp, (stop - 1) // rpp + 1
    pages = view.index_select(0, table[p0:p1].to(view.device, torch.int64))
    flat = pages.reshape(-1, *view.shape[2:])
    return flat[start - p0 * rpp : stop - p0 * rpp]
