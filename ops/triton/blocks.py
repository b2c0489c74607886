"""Block ops of the ``triton`` backend as Triton kernels: one launch per call, driven by the
index tensor (slot mapping, block table, block mapping), no host read of it.

One kernel, :func:`copy_rows_kernel`, copies rows: output row ``i`` is written at row
``DST_IDX[i]`` of the destination (skipped when negative) from row ``SRC_IDX[i]`` of the
source (or row ``i`` when there is no index), where a "row" of a blocked tensor
``[num_blocks, block_size, *row]`` is addressed as ``(slot // block_size, slot % block_size)``
with its own strides. Rows are copied as raw bits (reinterpreted as an integer type of the
widest width that divides them), so any dtype is copied exactly.

Either side may be pinned host memory when the other is on the GPU: the kernel reads or
writes it directly (CUDA maps page-locked memory into the device's address space), so a
host<->device transfer is also one launch on the copy stream instead of one
``cudaMemcpyAsync`` per run of consecutive pages. Under ``TRITON_INTERPRET=1`` the same
kernel runs on CPU tensors (tests).
"""

from __future__ import annotations

import functools

import torch

from ditmem.ops import blockcopy

BLOCK = 1024  # elements per program along a row


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def copy_rows_kernel(SRC, DST, SRC_IDX, DST_IDX, row_elems,
                         src_stride_b, src_stride_s, dst_stride_b, dst_stride_s,
                         SRC_BS: tl.constexpr, DST_BS: tl.constexpr,
                         HAS_SRC_IDX: tl.constexpr, HAS_DST_IDX: tl.constexpr,
                         BLOCK: tl.constexpr):
        i = tl.program_id(0)
        if HAS_SRC_IDX:
            s = tl.load(SRC_IDX + i).to(tl.int64)
        else:
            s = i.to(tl.int64)
        if HAS_DST_IDX:
            d = tl.load(DST_IDX + i).to(tl.int64)
        else:
            d = i.to(tl.int64)
        if d >= 0:
            cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            mask = cols < row_elems
            src = SRC + (s // SRC_BS) * src_stride_b + (s % SRC_BS) * src_stride_s
            dst = DST + (d // DST_BS) * dst_stride_b + (d % DST_BS) * dst_stride_s
            tl.store(dst + cols, tl.load(src + cols, mask=mask), mask=mask)

    return copy_rows_kernel


def _rows(t: torch.Tensor, lead: int) -> torch.Tensor:
    """``t`` with its trailing (row) dims as one dense dim: a view (never a copy, so writes
    land in ``t``); ValueError when rows are not dense."""
    try:
        return t.view(*t.shape[:lead], -1) if t.dim() > lead else t.unsqueeze(-1)
    except RuntimeError:
        raise ValueError(f"tensor (shape {tuple(t.shape)}, strides {t.stride()}): the triton "
                         "block ops need each row dense") from None


def _width(t: torch.Tensor) -> int:
    """The widest integer item size (bytes) a bit view of ``t`` ([..., E], dense rows) takes."""
    nbytes = t.shape[-1] * t.element_size()
    for size in (8, 4, 2):
        if nbytes % size == 0 and t.data_ptr() % size == 0 and all(
                st * t.element_size() % size == 0 for st in t.stride()[:-1]):
            return size
    return 1


def _bits(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The row views ``tensors`` as one integer type (the widest all of them allow)."""
    size = min(_width(t) for t in tensors)
    dtype = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[size]
    return [t.view(dtype) for t in tensors]


def _launch(src, dst, src_idx, dst_idx, rows, src_bs, dst_bs):
    """src/dst: bit views, 2-d [rows, E] (block size 1) or 3-d [blocks, block_size, E]."""
    if rows == 0:
        return
    elems = src.shape[-1]
    s_b, s_s = (src.stride(0), src.stride(1) if src.dim() == 3 else 0)
    d_b, d_s = (dst.stride(0), dst.stride(1) if dst.dim() == 3 else 0)
    dummy = src_idx if src_idx is not None else dst_idx if dst_idx is not None else src
    grid = (rows, -(-elems // BLOCK))
    _kernel()[grid](src, dst, src_idx if src_idx is not None else dummy,
                    dst_idx if dst_idx is not None else dummy, elems, s_b, s_s, d_b, d_s,
                    SRC_BS=src_bs, DST_BS=dst_bs, HAS_SRC_IDX=src_idx is not None,
                    HAS_DST_IDX=dst_idx is not None, BLOCK=BLOCK)


def write_blocks(x, cache, slot_mapping):
    """See ditmem.ops.write_blocks (validated; x already on cache's device and dtype)."""
    src, dst = _bits(_rows(x.contiguous(), 1), _rows(cache, 2))
    _launch(src, dst, None, slot_mapping.contiguous(), x.shape[0], 1, cache.shape[1])


def gather_blocks(cache, block_table, lens, *, total=None):
    """See ditmem.ops.gather_blocks. ``total`` = sum(lens) when known on the host (the op's
    validation reads it); else it is read here. The source slot of every output row is
    computed on the device."""
    lens64 = lens.to(torch.int64)
    if total is None:
        total = int(lens64.sum())
    out = cache.new_empty((total, *cache.shape[2:]))
    if total == 0:
        return out
    bs = cache.shape[1]
    ends = torch.cumsum(lens64, 0)
    rows = torch.arange(total, device=cache.device)
    req = torch.searchsorted(ends, rows, right=True)
    r = rows - (ends[req] - lens64[req])
    slots = block_table.to(torch.int64)[req, r // bs] * bs + r % bs
    src, dst = _bits(_rows(cache, 2), _rows(out, 1))
    _launch(src, dst, slots, None, total, bs, 1)
    return out


def _device_side(src, dst) -> torch.device:
    return src.device if src.device.type != "cpu" else dst.device


def copy_blocks(src, dst, mapping):
    """See ditmem.ops.copy_blocks: whole blocks, one launch. Across devices the host side
    must be pinned (the kernel reads/writes it directly); pageable host memory goes through
    torch copies of consecutive runs (ditmem.ops.blockcopy) instead."""
    cross = src.device != dst.device
    host = src if src.device.type == "cpu" else dst
    if cross and not host.is_pinned():
        blockcopy.copy_blocks(src, dst, mapping)
        return
    m = mapping.to(_device_side(src, dst), torch.int64, non_blocking=True)
    s, d = _bits(_rows(src, 1), _rows(dst, 1))
    _launch(s, d, m[:, 0].contiguous(), m[:, 1].contiguous(), m.shape[0], 1, 1)
