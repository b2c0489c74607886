"""Page accounting as pure functions: how many pages a tensor of a given shape needs.

This module imports nothing (not even torch), so the engine can hand the scheduler plain
numbers. ``dtype`` may be a ``torch.dtype`` (anything with an ``itemsize``), a dtype name
(``"bfloat16"``, ``"torch.float32"``) or an item size in bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

_ITEMSIZE = {
    "bool": 1, "uint8": 1, "int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int16": 2, "uint16": 2, "float16": 2, "half": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4, "float": 4, "complex32": 4,
    "int64": 8, "uint64": 8, "float64": 8, "double": 8, "complex64": 8,
    "complex128": 16,
}


def itemsize_of(dtype) -> int:
    """Bytes per element of ``dtype`` (a torch.dtype, a dtype name or an int)."""
    if isinstance(dtype, bool):
        raise ValueError(f"dtype: expected a dtype, a dtype name or an item size, got {dtype!r}")
    if isinstance(dtype, int):
        if dtype <= 0:
            raise ValueError(f"dtype: item size must be positive, got {dtype}")
        return dtype
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
        if name not in _ITEMSIZE:
            raise ValueError(f"dtype: unknown dtype name {dtype!r}")
        return _ITEMSIZE[name]
    size = getattr(dtype, "itemsize", None)
    if not isinstance(size, int):
        raise ValueError(f"dtype: expected a dtype, a dtype name or an item size, got {dtype!r}")
    return size


def normalize_row_shape(row_shape) -> tuple[int, ...]:
    """``row_shape`` as a tuple of non-negative ints (an int means a 1-d row)."""
    shape = (row_shape,) if isinstance(row_shape, int) else tuple(row_shape)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"row_shape: expected non-negative ints, got {row_shape!r}")
    return shape


def row_bytes(row_shape: Sequence[int] | int, dtype) -> int:
    """Bytes of one row ``[*row_shape]`` of ``dtype`` (a scalar row for ``()``)."""
    return math.prod(normalize_row_shape(row_shape)) * itemsize_of(dtype)


def rows_per_page(row_shape: Sequence[int] | int, dtype, page_bytes: int) -> int:
    """Whole rows that fit in one page; ``ValueError`` when a row is empty or too big."""
    rb = row_bytes(row_shape, dtype)
    if rb == 0:
        raise ValueError(f"row_shape: a row of shape {tuple(normalize_row_shape(row_shape))} "
                         "has no elements")
    if rb > page_bytes:
        raise ValueError(
            f"row_shape: one row of shape {tuple(normalize_row_shape(row_shape))} and "
            f"{itemsize_of(dtype)}-byte elements takes {rb} bytes, more than a page "
            f"({page_bytes} bytes); use a smaller row (e.g. row_shape=()) or bigger pages")
    return page_bytes // rb


def pages_for(rows: int, row_shape: Sequence[int] | int, dtype, page_bytes: int) -> int:
    """Pages needed by a paged tensor ``[rows, *row_shape]`` of ``dtype``.

    Rows never straddle pages: ``ceil(rows / (page_bytes // row_bytes))``.
    """
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise ValueError(f"rows: expected a non-negative int, got {rows!r}")
    return -(-rows // rows_per_page(row_shape, dtype, page_bytes))


def pages_for_bytes(nbytes: int, page_bytes: int) -> int:
    """Pages needed by ``nbytes`` of densely packed data (elements as rows)."""
    return -(-nbytes // page_bytes)
