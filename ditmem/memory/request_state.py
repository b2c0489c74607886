"""Everything one request carries between denoising steps, as named paged tensors + scalars.

A ``RequestState`` is generic: it stores any tensor under any name. The model adapters use
these conventional names (``<branch>`` is ``cond`` or ``uncond`` for the CFG branches; see
``ditmem.models.qwen.state`` / ``wan.state`` for the exact sets):

* ``latents`` — the current latents.
* ``prompt_embeds.<branch>``, ``prompt_mask.<branch>`` — text encoder output and its mask.
* ``solver.<name>`` — solver tensors (UniPC history ``solver.model_outputs.<k>``,
  ``solver.last_sample``); plain solver numbers (step index, sigmas as floats) go in
  ``scalars`` (``scalars["step"]``).
* ``cross_kv.<expert>.<branch>.<group>`` — cached Wan cross-attention K/V, put as a
  ``PagedTensor`` with rows ``[heads, head_dim]`` that kernels read through ``paged(name)``.
* ``cache.<name>`` — optional step-cache residuals.
* ``boundary.hidden.<branch>``, ``boundary.encoder_hidden.<branch>`` — block-boundary
  activations while a request is paused inside a step (``scalars["block"]`` = next block).

By default a tensor is stored element by element (``row_shape=()``), which packs densely
and fits any page size; ``row_ndim=k`` keeps the last ``k`` dims as one row instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ditmem.memory.paged_tensor import PagedTensor, TensorState


@dataclass(slots=True)
class _Entry:
    paged: PagedTensor
    shape: tuple[int, ...]  # the shape ``get`` returns


class RequestState:
    """Named ``PagedTensor``s of one request in ``pool`` plus a dict of plain ``scalars``."""

    def __init__(self, pool, request_id: str | None = None) -> None:
        self.pool = pool
        self.request_id = request_id
        self.scalars: dict[str, Any] = {}
        self._entries: dict[str, _Entry] = {}

    # ----------------------------------------------------------------- tensors
    def put(self, name: str, value, *, row_ndim: int | None = None) -> PagedTensor | None:
        """Store ``value`` (a ``torch.Tensor`` of any shape, or a ``PagedTensor`` of this pool,
        adopted as is) under ``name``; returns its ``PagedTensor``.

        Overwrites an existing entry of the same shape, dtype and layout in place. Returns
        ``None`` when the pool has no room (the previous entry, if any, is left untouched).
        """
        if isinstance(value, PagedTensor):
            if value.pool is not self.pool:
                raise ValueError(f"value: PagedTensor for {name!r} belongs to another pool")
            value._check_alive()
            self._replace(name, _Entry(value, value.shape))
            return value
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"value: expected a torch.Tensor or PagedTensor for {name!r}, got "
                             f"{type(value).__name__}")
        shape = tuple(value.shape)
        k = 0 if row_ndim is None else row_ndim
        if not 0 <= k <= len(shape):
            raise ValueError(f"row_ndim: {row_ndim} is not in [0, {len(shape)}] for shape {shape}")
        row_shape = shape[len(shape) - k:]
        rows = math.prod(shape[: len(shape) - k])
        data = value.reshape(rows, *row_shape)
        old = self._entries.get(name)
        if (old is not None and old.shape == shape and old.paged.row_shape == row_shape
                and old.paged.dtype == value.dtype and old.paged.state is TensorState.ON_DEVICE):
            old.paged.write(data)
            return old.paged
        paged = self.pool.allocate_tensor(rows, row_shape, value.dtype)
        if paged is None:
            return None
        paged.write(data)
        self._replace(name, _Entry(paged, shape))
        return paged

    def get(self, name: str) -> torch.Tensor:
        """A copy of tensor ``name`` in the shape it was put with (on the pool's device)."""
        entry = self._entry(name)
        entry.paged._check_state(TensorState.ON_DEVICE, f"get({name!r})")
        return entry.paged.read().reshape(entry.shape)

    def paged(self, name: str) -> PagedTensor:
        """The ``PagedTensor`` behind ``name`` (for kernels: ``page_table``, ``kernel_view``)."""
        return self._entry(name).paged

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape ``get(name)`` returns (metadata only, wherever the tensor lives)."""
        return self._entry(name).shape

    def delete(self, name: str) -> None:
        """Free tensor ``name``."""
        self._entry(name).paged.free()
        del self._entries[name]

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    # ----------------------------------------------------------------- accounting
    def tensors(self) -> list[PagedTensor]:
        return [e.paged for e in self._entries.values()]

    @property
    def num_pages(self) -> int:
        """Pages held by the tensors, wherever they are."""
        return sum(t.num_pages for t in self.tensors())

    @property
    def device_pages(self) -> int:
        """Device pages held (including the source or destination of transfers in flight)."""
        return sum(len(t._pages) for t in self.tensors()) + sum(
            t.num_pages for t in self.tensors() if t.state is TensorState.RESTORING)

    @property
    def device_bytes(self) -> int:
        return self.device_pages * self.pool.page_bytes

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data (not rounded up to pages)."""
        return sum(t.nbytes for t in self.tensors())

    @property
    def location(self) -> str:
        """"device", "host", "in_flight", "mixed" or "empty"."""
        states = {t.state for t in self.tensors()}
        if not states:
            return "empty"
        if states & {TensorState.OFFLOADING, TensorState.RESTORING}:
            return "in_flight"
        if states == {TensorState.ON_DEVICE}:
            return "device"
        if states == {TensorState.ON_HOST}:
            return "host"
        return "mixed"

    # ----------------------------------------------------------------- moves
    def start_offload(self, engine):
        """Launch the offload of every tensor on the device; finish with
        ``engine.finish_offload(handle)``. Raises ``HostPoolExhausted`` (nothing changed)."""
        on_device = TensorState.ON_DEVICE
        return engine.start_offload(
            [e.paged for e in self._entries.values() if e.paged._state is on_device])

    def start_restore(self, engine):
        """Launch the restore of every tensor on the host, or ``None`` (nothing changed) when
        the device pool has no room; finish with ``engine.finish_restore(handle)``."""
        on_host = TensorState.ON_HOST
        return engine.start_restore(
            [e.paged for e in self._entries.values() if e.paged._state is on_host])

    def offload(self, engine) -> None:
        engine.finish_offload(self.start_offload(engine))

    def restore(self, engine) -> bool:
        """Bring every tensor back to the device; ``False`` (nothing changed) if no room."""
        handle = self.start_restore(engine)
        if handle is None:
            return False
        engine.finish_restore(handle)
        return True

    def free(self) -> None:
        """Free every tensor (none may be in flight) and forget the scalars."""
        busy = [n for n, e in self._entries.items()
                if e.paged.state in (TensorState.OFFLOADING, TensorState.RESTORING)]
        if busy:
            from ditmem.memory.errors import TensorStateError

            raise TensorStateError(f"free: tensors {busy} are in flight; finish or cancel first")
        for entry in self._entries.values():
            entry.paged.free()
        self._entries.clear()
        self.scalars.clear()

    # ----------------------------------------------------------------- internals
    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"RequestState has no tensor {name!r}") from None

    def _replace(self, name: str, entry: _Entry) -> None:
        old = self._entries.get(name)
        if old is not None and old.paged is not entry.paged:
            old.paged.free()
        self._entries[name] = entry

    def __repr__(self) -> str:
        return (f"RequestState(id={self.request_id!r}, tensors={len(self)}, "
                f"pages={self.num_pages}, location={self.location})")
