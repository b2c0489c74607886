"""The ``triton`` backend: paged attention as a Triton kernel (ops/triton/kernel.py);
write/gather/copy of blocks use plain torch indexing on the GPU (bandwidth-bound copies
that torch already does well; see docs/results/ops.md).

triton is imported only when a kernel is launched, so this module imports on any machine.
"""

from __future__ import annotations

from ditmem.ops.triton.launch import copy_blocks, gather_blocks, paged_attention, write_blocks

__all__ = ["paged_attention", "write_blocks", "gather_blocks", "copy_blocks"]
