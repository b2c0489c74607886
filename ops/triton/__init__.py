"""The ``triton`` backend: paged attention (ops/triton/kernel.py, launched by launch.py) and
write/gather/copy of blocks (ops/triton/blocks.py), each one kernel launch driven by its
index tensor; host<->device block copies read/write pinned host memory from the kernel.

triton is imported only when a kernel is launched, so this module imports on any machine.
"""

from __future__ import annotations

from ditmem.ops.triton.blocks import copy_blocks, gather_blocks, write_blocks
from ditmem.ops.triton.launch import paged_attention

__all__ = ["paged_attention", "write_blocks", "gather_blocks", "copy_blocks"]
