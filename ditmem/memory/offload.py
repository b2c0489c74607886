"""Two-phase page moves between a ``PagePool`` (device) and a ``HostPool`` (host).

    h = eng.start_offload(tensors)   # host pages reserved, copy launched, tensors OFFLOADING
    eng.finish_offload(h)            # wait; device pages freed; tensors ON_HOST
    h = eng.start_restore(tensors)   # device pages reserved (None if they don't fit)
    eng.finish_restore(h)            # wait; host pages freed; tensors ON_DEVICE
    eng.cancel(h)                    # wait; destination freed; tensors back where they were

Pages in flight stay owned (source and destination) until finish/cancel, so they are never
handed out. Restore lands in whatever device pages are free.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ditmem.memory.copiers import make_copier
from ditmem.memory.copy_plan import (
    TRIM_GRANULE,
    MappingBuffer,
    block_ids,
    block_view,
    granule_for,
    pairs,
)
from ditmem.memory.errors import TransferError
from ditmem.memory.host_pool import HostPool
from ditmem.memory.page_pool import PagePool
from ditmem.memory.paged_tensor import PagedTensor, TensorState
from ditmem.ops import copy_blocks


@dataclass(slots=True, eq=False)
class TransferHandle:
    """One launched transfer of a group of tensors (``kind`` "offload" or "restore")."""

    kind: str
    tensors: tuple[PagedTensor, ...]
    src_pages: list[list[int]]
    dst_pages: list[list[int]]
    token: object = None
    status: str = "in_flight"  # "in_flight" | "finished" | "cancelled" | "failed"
    id: int = 0
    engine: object = field(default=None, repr=False)
    timing: object = field(default=None, repr=False)  # the copier's token, kept for copy_s

    @property
    def num_pages(self) -> int:
        return sum(len(p) for p in self.src_pages)

    @property
    def copy_s(self) -> float:
        """Seconds the copy itself took (device events on a stream copier, the wall clock of
        the copy otherwise); 0.0 when nothing was copied. Once finished; on a stream copier
        it waits for the copy's end event."""
        if self.status != "finished":
            raise TransferError(f"copy_s: transfer {self.id} is {self.status}, not finished")
        return 0.0 if self.timing is None else self.engine._copier.elapsed(self.timing)


class OffloadEngine:
    """Moves ``PagedTensor`` pages device -> host and back with ``ditmem.ops.copy_blocks``.

    ``mode``: "auto" (side stream on CUDA/NPU, synchronous on CPU), "sync", "thread" (a
    worker thread) or "stream". ``pool`` and ``host`` must have the same ``page_bytes``; a
    CUDA/NPU pool needs a pinned host pool.

    ``trim_tails`` copies only the granules (``trim_granule`` bytes, see ``copy_plan``) of
    each tensor's last page that hold data; ``None`` means on for CPU and CUDA pools (one
    kernel launch or C++ call per transfer, whatever the mapping's length) and off for NPU
    pools (their copies go run by run of consecutive blocks, and granules make the mapping
    ``page_bytes / trim_granule`` times longer). Either way a transfer is one
    ``copy_blocks`` call per host chunk it touches. ``copy_fn`` replaces
    ``ditmem.ops.copy_blocks`` (same signature), e.g. to measure the op's own overhead;
    like the op it must be done with ``mapping`` when its copy completes (on a CPU pool the
    engine refills one mapping buffer for the next transfer when nothing is in flight).
    """

    def __init__(self, pool: PagePool, host: HostPool, *, mode: str = "auto",
                 trim_tails: bool | None = None,
                 trim_granule: int = TRIM_GRANULE, copy_fn=None) -> None:
        if pool.page_bytes != host.page_bytes:
            raise ValueError(f"host: page_bytes {host.page_bytes} differs from the pool's "
                             f"{pool.page_bytes}")
        if pool.device.type in ("cuda", "npu") and not host.is_pinned:
            raise ValueError(f"host: a {pool.device.type} pool needs a pinned HostPool "
                             "(HostPool(..., device=pool.device)) for asynchronous copies")
        self.pool, self.host = pool, host
        self._copier = make_copier(mode, pool.device)
        self.mode = self._copier.name
        self.trim_tails = pool.device.type in ("cpu", "cuda") if trim_tails is None \
            else trim_tails
        self.granule = granule_for(pool.page_bytes, self.trim_tails, trim_granule)
        self._device_blocks = block_view(pool.arena, self.granule)
        self._host_blocks = [block_view(c, self.granule) for c in host.chunks]
        self._host_chunk_blocks = host.chunk_pages * (pool.page_bytes // self.granule)
        # on a CPU pool every copy reads its mapping on the host before it completes
        self._map_buf = MappingBuffer() if pool.device.type == "cpu" else None
        self._copy_fn = copy_fn
        self._ids = itertools.count(1)
        self._in_flight: dict[int, TransferHandle] = {}

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    # ----------------------------------------------------------------- offload
    def start_offload(self, tensors) -> TransferHandle:
        """Launch device -> host copies of ``tensors`` (all ``ON_DEVICE`` in this pool).

        Raises ``HostPoolExhausted`` (nothing changed) when the host pool is too small.
        """
        tensors = self._check(tensors, TensorState.ON_DEVICE, "start_offload")
        src = [t._pages for t in tensors]
        flat = self.host.allocate(sum(len(p) for p in src))
        dst = _split(flat, src)
        return self._launch("offload", tensors, src, dst, TensorState.OFFLOADING,
                            release=self.host)

    def finish_offload(self, handle: TransferHandle) -> None:
        """Wait for an offload; free its device pages; its tensors become ``ON_HOST``."""
        self._expect(handle, "offload")
        self._wait(handle, self._copier.wait_host)
        self.pool.free([p for pages in handle.src_pages for p in pages])
        for t, d in zip(handle.tensors, handle.dst_pages, strict=True):
            t._land_on_host(self.host, d)
        self._close(handle, "finished")

    # ----------------------------------------------------------------- restore
    def start_restore(self, tensors) -> TransferHandle | None:
        """Launch host -> device copies of ``tensors`` (all ``ON_HOST`` via this engine).

        Returns ``None`` (nothing changed, data still on the host) when the device pool has
        too few free pages: as with ``PagePool.allocate``, the caller decides who yields.
        """
        tensors = self._check(tensors, TensorState.ON_HOST, "start_restore")
        src = [t._host_pages for t in tensors]
        flat = self.pool.allocate(sum(len(p) for p in src))
        if flat is None:
            return None
        dst = _split(flat, src)
        return self._launch("restore", tensors, src, dst, TensorState.RESTORING,
                            release=self.pool)

    def finish_restore(self, handle: TransferHandle) -> None:
        """Complete a restore: the device's current stream waits for the copy; the host
        pages are freed; its tensors become ``ON_DEVICE`` in the new pages."""
        self._expect(handle, "restore")
        self._wait(handle, self._copier.wait_device)
        # On a side stream the copy may still be reading these host pages; that is safe
        # because only copies queued behind it on the same stream ever write host pages.
        self.host.free([p for pages in handle.src_pages for p in pages])
        for t, d in zip(handle.tensors, handle.dst_pages, strict=True):
            t._land_on_device(d)
        self._close(handle, "finished")

    # ----------------------------------------------------------------- both
    def finish(self, handle: TransferHandle) -> None:
        """``finish_offload`` or ``finish_restore``, whichever ``handle`` is."""
        (self.finish_offload if handle.kind == "offload" else self.finish_restore)(handle)

    def ready(self, handle: TransferHandle) -> bool:
        """Whether finishing ``handle`` now would not block (polls, never waits)."""
        self._expect(handle, handle.kind)
        return handle.token is None or self._copier.ready(handle.token)

    def cancel(self, handle: TransferHandle) -> None:
        """Abandon a transfer: wait for the copy, free its destination pages, and put its
        tensors back in their previous state with their data where it was."""
        self._expect(handle, handle.kind)
        try:
            self._copier.wait_host(handle.token)
        except Exception:  # the copy failed; the source is intact either way
            pass
        self._rollback(handle, "cancelled")

    def offload(self, tensors) -> None:
        """``start_offload`` + ``finish_offload``."""
        self.finish_offload(self.start_offload(tensors))

    def restore(self, tensors) -> bool:
        """``start_restore`` + ``finish_restore``; ``False`` (nothing changed) if no room."""
        handle = self.start_restore(tensors)
        if handle is None:
            return False
        self.finish_restore(handle)
        return True

    def close(self) -> None:
        """Cancel what is still in flight and stop the copier."""
        for handle in list(self._in_flight.values()):
            self.cancel(handle)
        self._copier.close()

    # ----------------------------------------------------------------- internals
    def _check(self, tensors, wanted: TensorState, what: str) -> tuple[PagedTensor, ...]:
        tensors = tuple(tensors)
        if len(set(map(id, tensors))) != len(tensors):
            raise ValueError(f"tensors: {what} got the same tensor twice")
        for t in tensors:
            if not isinstance(t, PagedTensor):
                raise ValueError(f"tensors: expected PagedTensor, got {type(t).__name__}")
            if t.pool is not self.pool:
                raise ValueError(f"tensors: {what} got a tensor of another pool")
            if t._state is not wanted:
                t._check_state(wanted, what)  # raises, naming the state it is in
            if wanted is TensorState.ON_HOST and t._host is not self.host:
                raise ValueError(f"tensors: {what} got a tensor offloaded to another host pool")
        return tensors

    def _launch(self, kind, tensors, src, dst, state, release):
        handle = TransferHandle(kind, tensors, src, dst, id=next(self._ids), engine=self)
        try:
            s_ids, d_ids = block_ids(tensors, src, dst, self.pool.page_bytes, self.granule)
            if s_ids:
                copies = self._copies(kind, s_ids, d_ids)
                copy = self._copy_fn or copy_blocks
                handle.token = self._copier.start(
                    lambda: [copy(src, dst, mapping) for src, dst, mapping in copies])
        except BaseException:
            release.free([p for pages in dst for p in pages])
            raise
        for t in tensors:
            t._begin(state)
        self._in_flight[handle.id] = handle
        return handle

    def _copies(self, kind, s_ids, d_ids):
        """``[(src blocks, dst blocks, mapping)]``: one copy per host chunk touched (one in
        all for a single-chunk host pool)."""
        dev, host = self._device_blocks, self._host_blocks
        if len(host) == 1:
            pair = (dev, host[0]) if kind == "offload" else (host[0], dev)
            return [(*pair, self._mapping(s_ids, d_ids))]
        per = self._host_chunk_blocks
        host_ids = d_ids if kind == "offload" else s_ids
        groups: dict[int, list[int]] = {}
        for i, h in enumerate(host_ids):
            groups.setdefault(h // per, []).append(i)
        copies = []
        for c, idx in sorted(groups.items()):
            s, d = [s_ids[i] for i in idx], [d_ids[i] for i in idx]
            if kind == "offload":
                copies.append((dev, host[c], pairs(s, [x - c * per for x in d])))
            else:
                copies.append((host[c], dev, pairs([x - c * per for x in s], d)))
        return copies

    def _mapping(self, s_ids, d_ids):
        # the shared buffer only when no copy is in flight: a copy has read its mapping by
        # the time it completes, and every transfer completes before it leaves _in_flight
        if self._map_buf is not None and not self._in_flight:
            mapping = self._map_buf.fill(s_ids, d_ids)
            if mapping is not None:
                return mapping
        return pairs(s_ids, d_ids)

    def _expect(self, handle, kind: str) -> None:
        if not isinstance(handle, TransferHandle) or handle.engine is not self:
            raise TransferError("handle: not a transfer of this engine")
        if handle.status != "in_flight":
            raise TransferError(f"handle: transfer {handle.id} is already {handle.status}")
        if handle.kind != kind:
            raise TransferError(f"handle: transfer {handle.id} is a {handle.kind}, not a {kind}")

    def _wait(self, handle, wait) -> None:
        if handle.token is None:
            return
        try:
            wait(handle.token)
        except BaseException:
            self._rollback(handle, "failed")
            raise

    def _rollback(self, handle, status: str) -> None:
        back = TensorState.ON_DEVICE if handle.kind == "offload" else TensorState.ON_HOST
        dst_pool = self.host if handle.kind == "offload" else self.pool
        for t, d in zip(handle.tensors, handle.dst_pages, strict=True):
            dst_pool.free(d)
            t._begin(back)
        self._close(handle, status)

    def _close(self, handle, status: str) -> None:
        handle.status = status
        handle.timing = handle.token if status == "finished" else None
        handle.token = None
        del self._in_flight[handle.id]


def _split(flat: list[int], like: list[list[int]]) -> list[list[int]]:
    out, i = [], 0
    for pages in like:
        out.append(flat[i : i + len(pages)])
        i += len(pages)
    return out
