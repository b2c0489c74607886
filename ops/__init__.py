"""ditmem.ops: paged attention and block copy/gather/scatter.

Public API (contract in shared DESIGN.md "Ops"): ``paged_attention``, ``write_blocks``,
``gather_blocks``, ``copy_blocks``. This first version exposes the pure-torch reference;
backend dispatch (cpu C++, triton, npu) is added on top of it.
"""

from ditmem.ops.reference import copy_blocks, gather_blocks, paged_attention, write_blocks

__all__ = ["paged_attention", "write_blocks", "gather_blocks", "copy_blocks"]
