"""ditmem.memory: paged device memory, a host pool, asynchronous offload/restore, and the
per-request state container built on them.

    pool = PagePool(num_pages, page_bytes, device)      # device arena; allocate -> pages | None
    host = HostPool(num_pages, page_bytes)              # host arena (pinned for cuda/npu)
    t = pool.allocate_tensor(rows, row_shape, dtype)    # PagedTensor | None
    eng = OffloadEngine(pool, host)                     # two-phase page moves
    state = RequestState(pool)                          # named tensors + scalars of a request

Accounting for the scheduler is in :mod:`ditmem.memory.accounting` (pure functions).
"""

from ditmem.memory.accounting import pages_for, pages_for_bytes, rows_per_page
from ditmem.memory.errors import (
    DoubleFreeError,
    HostPoolExhausted,
    MemoryManagerError,
    TensorFreedError,
    TensorStateError,
    TransferError,
)
from ditmem.memory.host_pool import HostPool
from ditmem.memory.offload import OffloadEngine, TransferHandle
from ditmem.memory.page_pool import PagePool, PoolStats
from ditmem.memory.paged_tensor import PagedTensor, TensorState
from ditmem.memory.request_state import RequestState

__all__ = [
    "PagePool", "PoolStats", "HostPool", "PagedTensor", "TensorState", "OffloadEngine",
    "TransferHandle", "RequestState", "pages_for", "pages_for_bytes", "rows_per_page",
    "MemoryManagerError", "HostPoolExhausted", "DoubleFreeError", "TensorFreedError",
    "TensorStateError", "TransferError",
]
