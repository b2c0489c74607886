"""Moving a request's paged state between devices and sequence-parallel degrees.

At degree ``d`` each device of the request's group holds a ``RequestState`` in its own
page pool: the token-sharded tensors (:data:`TOKEN_DIM`: Qwen-Image's packed latents)
hold only that device's rows ``shard(S, d, rank)``; everything else (text embeddings and
masks, scalars) is replicated. Two ways to change where a state lives:

* :func:`reshard` — between steps, over the device link: every device of the smallest
  aligned group covering the old and the new devices joins; latent rows are all-gathered
  and each new holder keeps its shard; replicated tensors are broadcast from the first old
  holder. No host copy, no pickled tensors (only the scalars and tensor shapes travel as
  objects).
* through host pages — a paused request: each holder offloads its part into its host pool
  (:func:`host_copy` describes where the pages are), and the new holders, on any devices,
  read those pages straight from the host arenas (shared memory between the worker
  processes) into their own device pages (:func:`adopt`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ditmem.memory import RequestState, TensorState
from ditmem.parallel.shards import shard

#: token-sharded tensors and their token dimension (Qwen-Image packed latents [1, S, C]);
#: states of other models move only at degree 1 (see :func:`check_degree`)
TOKEN_DIM = {"latents": 1}


def check_degree(generator, degree: int) -> None:
    """ValueError unless ``generator``'s states can be held at ``degree`` (degree > 1:
    Qwen-Image, whose packed latents are token rows). Deterministic, so every device of a
    collective refuses alike before any exchange."""
    if degree > 1 and type(getattr(generator, "adapter", None)).__name__ != "QwenAdapter":
        raise ValueError(f"degree {degree}: sequence-parallel states are implemented for "
                         f"Qwen-Image; {type(generator).__name__} requests run at degree 1")


@dataclass(slots=True)
class TensorPages:
    """Where one offloaded tensor sits in a host pool: its host pages in row order and its
    layout (``rows`` of ``row_shape`` ``dtype``; ``shape`` as ``RequestState.get`` returns)."""

    host_pages: list[int]
    rows: int
    row_shape: tuple[int, ...]
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass(slots=True)
class HostCopy:
    """One device's offloaded part of a request: ``tensors`` by name, the ``scalars``, and
    the part's ``rank`` in its group of ``degree``."""

    device: int
    tensors: dict[str, TensorPages]
    scalars: dict
    rank: int
    degree: int


def host_copy(state: RequestState, device: int, rank: int, degree: int) -> HostCopy:
    """Describe an offloaded state (every tensor on the host) for :func:`adopt`."""
    tensors = {}
    for name in state.names():
        t = state.paged(name)
        if t.state is not TensorState.ON_HOST:
            raise ValueError(f"host_copy: {state.request_id} tensor {name!r} is "
                             f"{t.state.value}, not on the host")
        tensors[name] = TensorPages(t.host_pages, t.rows, t.row_shape, t.dtype,
                                    state.shape(name))
    return HostCopy(device, tensors, copy.deepcopy(state.scalars), rank, degree)


def read_host(host, pages: TensorPages) -> torch.Tensor:
    """A copy of one tensor out of host pool ``host`` (any process's, shared memory)."""
    rows = host.page_rows(pages.host_pages, pages.dtype, pages.row_shape)
    return rows.flatten(0, 1)[: pages.rows].reshape(pages.shape)


def _check_whole_steps(scalars: dict, degree: int, request_id) -> None:
    if degree > 1 and scalars.get("block", 0):
        raise ValueError(f"{request_id}: paused inside a step (block {scalars['block']}); "
                         "only whole steps run at degree > 1")


def adopt(parts: list[HostCopy], hosts: dict[int, object], pool, rank: int, degree: int,
          request_id: str, device) -> RequestState | None:
    """This device's part (``rank`` of ``degree``) of a request whose parts were offloaded
    by their holders (``parts``, any order), read from their host pools ``hosts`` (by
    device) into fresh pages of ``pool``. ``None`` (nothing left allocated) when ``pool``
    has no room."""
    parts = sorted(parts, key=lambda p: p.rank)
    _check_whole_steps(parts[0].scalars, degree, request_id)
    state = RequestState(pool, request_id=request_id)
    for name, first in parts[0].tensors.items():
        if name in TOKEN_DIM:
            dim = TOKEN_DIM[name]
            full = torch.cat([read_host(hosts[p.device], p.tensors[name]) for p in parts], dim)
            lo, hi = shard(full.shape[dim], degree, rank)
            value = full.narrow(dim, lo, hi - lo)
        else:
            value = read_host(hosts[parts[0].device], first)
        if state.put(name, value.to(device).contiguous(),
                     row_ndim=len(first.row_shape)) is None:
            state.free()
            return None
    state.scalars.update(copy.deepcopy(parts[0].scalars))
    return state


def reshard(state: RequestState | None, group, cover: tuple[int, ...], device: int,
            old: tuple[int, ...], new: tuple[int, ...], pool, request_id: str
            ) -> RequestState | None:
    """Collective over ``group`` (the process group of the aligned devices ``cover``, which
    contain ``old`` and ``new``): move a request held at degree ``len(old)`` on ``old`` to
    degree ``len(new)`` on ``new``. Every device of ``cover`` calls it; ``state`` is this
    device's part (``None`` unless it is in ``old``). Returns this device's new part
    (``None`` unless it is in ``new``); the old part's pages are freed. ``MemoryError``
    when a new holder's pool has no room (its old part, if any, is kept)."""
    me = cover.index(device)
    src = old[0]
    meta = [None]
    if device == src:
        meta = [(copy.deepcopy(state.scalars),
                 {n: (state.shape(n), state.paged(n).dtype, len(state.paged(n).row_shape))
                  for n in state.names()})]
    dist.broadcast_object_list(meta, src=src, group=group)
    scalars, shapes = meta[0]
    _check_whole_steps(scalars, len(new), request_id)
    values = {}
    for name, (shape, dtype, _) in sorted(shapes.items()):
        if name in TOKEN_DIM:
            values[name] = _gather_tokens(state, name, shape, dtype, group, cover, old, me,
                                          pool.device)
            continue
        buf = state.get(name) if device == src else torch.empty(shape, dtype=dtype,
                                                                device=pool.device)
        dist.broadcast(buf, src=src, group=group)
        values[name] = buf
    fresh = None
    if device in new:
        rank, degree = new.index(device), len(new)
        fresh = RequestState(pool, request_id=request_id)
        for name, value in values.items():
            if name in TOKEN_DIM:
                dim = TOKEN_DIM[name]
                lo, hi = shard(value.shape[dim], degree, rank)
                value = value.narrow(dim, lo, hi - lo).contiguous()
            if fresh.put(name, value, row_ndim=shapes[name][2]) is None:
                fresh.free()
                raise MemoryError(f"reshard: device {device} has no room for {request_id}")
        fresh.scalars.update(scalars)
    if state is not None:
        state.free()
    return fresh


def _gather_tokens(state, name, shape, dtype, group, cover, old, me, device) -> torch.Tensor:
    """The whole token-sharded tensor ``name`` on every device of ``cover``: each old
    holder contributes its rows (an all-gather of equal-size padded buffers)."""
    dim = TOKEN_DIM[name]
    rows = torch.zeros(len(cover), dtype=torch.int64, device=device)
    mine = state.get(name) if state is not None else None
    if mine is not None:
        rows[me] = mine.shape[dim]
    dist.all_reduce(rows, group=group)  # each device's row count, everywhere
    counts = rows.tolist()  # control data (a few ints), before the tensor exchange
    width = max(counts)
    padded_shape = list(shape)
    padded_shape[dim] = width
    padded = torch.zeros(padded_shape, dtype=dtype, device=device)
    if mine is not None:
        padded.narrow(dim, 0, mine.shape[dim]).copy_(mine)
    bufs = [torch.empty_like(padded) for _ in cover]
    dist.all_gather(bufs, padded, group=group)
    parts = [bufs[cover.index(d)].narrow(dim, 0, counts[cover.index(d)]) for d in old]
    return torch.cat(parts, dim)
