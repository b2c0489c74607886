"""Block ops in plain torch, for backends that have no kernels of their own for them (the
NPU backend re-exports these as its ``write_blocks`` / ``gather_blocks`` / ``copy_blocks``;
inputs already validated by ``ditmem.ops``)."""

from __future__ import annotations

from ditmem.ops import blockcopy, reference


def write_blocks(x, cache, slot_mapping):
    """Plain torch scatter (ditmem.ops.reference.write_blocks)."""
    reference.write_blocks(x, cache, slot_mapping)


def gather_blocks(cache, block_table, lens, *, total=None):
    """Plain torch gather (ditmem.ops.reference.gather_blocks)."""
    return reference.gather_blocks(cache, block_table, lens)


def copy_blocks(src, dst, mapping):
    """index_copy_ on one device, coalesced copy_ runs across devices (ops/blockcopy.py)."""
    blockcopy.copy_blocks(src, dst, mapping)
