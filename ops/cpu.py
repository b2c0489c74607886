"""The ``cpu`` backend: C++ kernels of ditmem._C (torch.ops.ditmem.*), plus their fake
kernels so the ops trace under torch.compile.

Kernels: csrc/paged_attention.cpp, csrc/blocks.cpp; schemas: csrc/schemas.cpp.
"""

from __future__ import annotations

import torch

import ditmem._C  # noqa: F401  (registers torch.ops.ditmem.*)
from ditmem.ops import blockcopy

_ops = torch.ops.ditmem


@torch.library.register_fake("ditmem::paged_attention")
def _paged_attention_fake(q, k_cache, v_cache, cu_seqlens_q, block_table, kv_lens, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.register_fake("ditmem::write_blocks")
def _write_blocks_fake(x, cache, slot_mapping):
    return None


@torch.library.register_fake("ditmem::gather_blocks")
def _gather_blocks_fake(cache, block_table, lens):
    rows = torch.library.get_ctx().new_dynamic_size()
    return cache.new_empty((rows, *cache.shape[2:]))


@torch.library.register_fake("ditmem::copy_blocks")
def _copy_blocks_fake(src, dst, mapping):
    return None


def _blocks_packed(cache: torch.Tensor) -> bool:
    """Whether each block [block_size, H_kv, D] is dense (the block stride may be anything)."""
    _, bs, h, d = cache.shape
    return cache.stride(3) == 1 and cache.stride(2) == d and cache.stride(1) == h * d


def paged_attention(q, k_cache, v_cache, cu_seqlens_q, block_table, kv_lens, *, scale,
                    host=None):
    """See ditmem.ops.paged_attention (inputs already validated, scale resolved).

    The kernel reads blocks in place when each block is dense (any block stride, e.g. pages
    of a larger arena); caches with other layouts are copied to contiguous memory first."""
    if not _blocks_packed(k_cache):
        k_cache = k_cache.contiguous()
    if not _blocks_packed(v_cache):
        v_cache = v_cache.contiguous()
    return _ops.paged_attention(q, k_cache, v_cache, cu_seqlens_q, block_table, kv_lens, scale)


def write_blocks(x, cache, slot_mapping):
    """See ditmem.ops.write_blocks (x already on cache's device and dtype)."""
    _ops.write_blocks(x, cache, slot_mapping)


def gather_blocks(cache, block_table, lens, *, total=None):
    """See ditmem.ops.gather_blocks (``total`` is not needed here)."""
    return _ops.gather_blocks(cache, block_table, lens)


def copy_blocks(src, dst, mapping):
    """See ditmem.ops.copy_blocks: the C++ kernel when both sides are CPU tensors, torch
    copies (ditmem.ops.blockcopy) when one side is on another device."""
    if src.device.type == "cpu" and dst.device.type == "cpu":
        _ops.copy_blocks(src, dst, mapping)
    else:
        blockcopy.copy_blocks(src, dst, mapping)
