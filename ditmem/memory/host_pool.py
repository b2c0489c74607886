"""The host-side page pool that offloaded tensors live in."""

from __future__ import annotations

import torch

from ditmem.memory.arena import PageArena
from ditmem.memory.errors import HostPoolExhausted

_PINNED_DEVICE_TYPES = ("cuda", "npu")


def _accelerator_available(kind: str) -> bool:
    module = getattr(torch, kind, None)
    return bool(module is not None and module.is_available())


#: default chunk of a host pool: pinning one huge block is slow and can fail outright
CHUNK_BYTES = 1 << 30


class HostPool(PageArena):
    """Pages of a host arena (CPU memory) in chunks ``uint8 [chunk_pages, page_bytes]`` of
    ``chunk_bytes`` (1 GiB by default; page ``p`` is row ``p % chunk_pages`` of chunk
    ``p // chunk_pages``).

    Page-locked (pinned) when it serves a CUDA/NPU device, so copies can run asynchronously:
    ``device`` names that device; when it is ``None`` the memory is pinned if CUDA (or NPU)
    is available. ``pin_memory`` overrides the choice.

    Unlike ``PagePool.allocate`` (which returns ``None`` so the scheduler can decide who
    yields), running out of host pages is a hard limit: ``allocate`` raises
    ``HostPoolExhausted`` and changes nothing. Size the host pool for the worst case.
    """

    def __init__(self, num_pages: int, page_bytes: int = 256 << 10, *, device=None,
                 pin_memory: bool | None = None, prefault: bool = True,
                 chunk_bytes: int | None = None) -> None:
        chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        if not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes: expected a positive int, got {chunk_bytes!r}")
        if pin_memory is None:
            if device is None:
                pin_memory = any(_accelerator_available(k) for k in _PINNED_DEVICE_TYPES)
            else:
                pin_memory = torch.device(device).type in _PINNED_DEVICE_TYPES
        super().__init__(num_pages, page_bytes, "cpu", pin_memory=pin_memory,
                         prefault=prefault, chunk_pages=max(1, chunk_bytes // max(1, page_bytes)))

    def allocate(self, n: int) -> list[int]:
        """``n`` host page ids; raises ``HostPoolExhausted`` if fewer are free."""
        pages = self._take(n)
        if pages is None:
            raise HostPoolExhausted(
                f"host pool: {n} pages requested, {self.num_free_pages} of {self.num_pages} "
                f"free (page_bytes={self.page_bytes}); make the host pool bigger")
        return pages

    def __repr__(self) -> str:
        return (f"HostPool(num_pages={self.num_pages}, page_bytes={self.page_bytes}, "
                f"chunks={self.num_chunks}, pinned={self.is_pinned}, free={self.num_free_pages})")
