"""ditmem.ops: ragged paged attention and block copy/gather/scatter.

Public API (contract in DESIGN.md "Ops"): ``paged_attention`` (and ``planned_attention``
over an ``AttentionPlan`` built once for many layers), ``write_blocks``,
``gather_blocks``, ``copy_blocks``; backend control: ``backend_for``,
``available_backends``, ``use_backend`` and the ``DITMEM_OPS_BACKEND`` environment variable.
Backends: ``reference`` (pure torch), ``cpu`` (C++ in ditmem._C), ``triton`` (GPU),
``npu`` (torch_npu).
"""

from ditmem.ops.api import (
    copy_blocks,
    gather_blocks,
    paged_attention,
    planned_attention,
    write_blocks,
)
from ditmem.ops.backends import (
    BackendUnavailableError,
    available_backends,
    backend_for,
    use_backend,
)
from ditmem.ops.plan import AttentionPlan

__all__ = [
    "paged_attention",
    "planned_attention",
    "AttentionPlan",
    "write_blocks",
    "gather_blocks",
    "copy_blocks",
    "backend_for",
    "available_backends",
    "use_backend",
    "BackendUnavailableError",
]
