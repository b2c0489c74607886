"""Moving a request's paged state between devices and sequence-parallel degrees.

At degree ``d`` each device of the request's group holds a ``RequestState`` in its own
page pool: the token-sharded tensors (:mod:`ditmem.parallel.token_rows`: Qwen-Image's
packed latents; Wan's latents and UniPC history) hold only that device's token rows
``shard(S, d, rank)`` ``[1, n, P]``; everything else (text embeddings and masks, Wan's
cross-attention K/V pages, scalars) is replicated. The scalar ``sp.shapes`` records the
degree-1 shapes of the sharded tensors while the state is held at degree > 1. Two ways to
change where a state lives:

* :func:`reshard` — between steps, over the device link, point to point between exactly
  the old and the new holders (``batch_isend_irecv`` on the node's default group, created
  at start): each old holder sends each new holder the rows of its shard that fall in the
  new holder's shard, and the first old holder sends the replicated tensors to new holders
  that had none. No other device takes part, so a move never waits for an uninvolved
  device's step. Row counts follow from the degree-1 shapes (python ints, no device
  reads); no host copy, no pickled tensors (only the scalars and tensor shapes travel, as
  bytes, to new holders that had no part).
  :func:`reshard_over_group` is the session-5 way (a collective over the smallest aligned
  group covering both: every device of it joins), kept as the baseline of
  ``benchmarks/parallel/bench_moves.py``.
* through host pages — a paused request: each holder offloads its part into its host pool
  (:func:`host_copy` describes where the pages are), and the new holders, on any devices,
  read those pages straight from the host arenas (shared memory between the worker
  processes) into their own device pages (:func:`adopt`).
"""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ditmem.memory import RequestState, TensorState
from ditmem.parallel.shards import bounds, shard
from ditmem.parallel.token_rows import SHAPES, TokenRows, rows_of


def check_degree(generator, degree: int) -> None:
    """ValueError unless ``generator``'s states can be held at ``degree`` (degree > 1:
    Qwen-Image and Wan, :func:`ditmem.parallel.token_rows.rows_of`). Deterministic, so
    every device of a collective refuses alike before any exchange."""
    if degree > 1:
        rows_of(generator)


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
          request_id: str, device, layout: TokenRows) -> RequestState | None:
    """This device's part (``rank`` of ``degree``) of a request whose parts were offloaded
    by their holders (``parts``, any order), read from their host pools ``hosts`` (by
    device) into fresh pages of ``pool``; ``layout``: the model's token-sharded tensors.
    ``None`` (nothing left allocated) when ``pool`` has no room."""
    parts = sorted(parts, key=lambda p: p.rank)
    _check_whole_steps(parts[0].scalars, degree, request_id)
    scalars = copy.deepcopy(parts[0].scalars)
    full = scalars.pop(SHAPES, None) or {n: t.shape for n, t in parts[0].tensors.items()
                                         if layout.sharded(n)}
    state = RequestState(pool, request_id=request_id)
    for name, first in parts[0].tensors.items():
        if layout.sharded(name):
            if parts[0].degree > 1:
                rows = torch.cat([read_host(hosts[p.device], p.tensors[name]) for p in parts], 1)
            else:
                rows = layout.to_rows(read_host(hosts[parts[0].device], first))
            value = _part_of(layout, rows, full[name], rank, degree)
        else:
            value = read_host(hosts[parts[0].device], first)
        if state.put(name, value.to(device).contiguous(),
                     row_ndim=len(first.row_shape)) is None:
            state.free()
            return None
    state.scalars.update(scalars)
    if degree > 1:
        state.scalars[SHAPES] = full
    return state


def _part_of(layout: TokenRows, rows: torch.Tensor, shape, rank: int,
             degree: int) -> torch.Tensor:
    """Rank ``rank``'s token rows of all ``rows [1, S, P]`` at ``degree`` > 1; at degree 1
    the whole tensor back in its degree-1 ``shape``."""
    if degree == 1:
        return layout.from_rows(rows, shape)
    lo, hi = shard(rows.shape[1], degree, rank)
    return rows.narrow(1, lo, hi - lo)


def reshard_over_group(state: RequestState | None, group, cover: tuple[int, ...],
                       device: int, old: tuple[int, ...], new: tuple[int, ...], pool,
                       request_id: str, layout: TokenRows) -> RequestState | None:
    """The baseline of :func:`reshard` (session 5): a collective over ``group`` (the
    process group of the aligned devices ``cover``, which contain ``old`` and ``new``):
    move a request held at degree ``len(old)`` on ``old`` to degree ``len(new)`` on
    ``new``; ``layout``: the model's token-sharded tensors. Every
    device of ``cover`` calls it; ``state`` is this device's part (``None`` unless it is
    in ``old``). Returns this device's new part (``None`` unless it is in ``new``); the
    old part's pages are freed. ``MemoryError`` when a new holder's pool has no room (its
    old part, if any, is kept)."""
    me = cover.index(device)
    src = old[0]
    meta = [None]
    if device == src:
        scalars = copy.deepcopy(state.scalars)
        full = scalars.pop(SHAPES, None) or {n: state.shape(n) for n in state.names()
                                             if layout.sharded(n)}
        meta = [(scalars, full,
                 {n: (state.shape(n), state.paged(n).dtype, len(state.paged(n).row_shape))
                  for n in state.names()})]
    dist.broadcast_object_list(meta, src=src, group=group)
    scalars, full, shapes = meta[0]
    _check_whole_steps(scalars, len(new), request_id)
    values = {}
    for name, (shape, dtype, _) in sorted(shapes.items()):
        if layout.sharded(name):
            mine = None
            if state is not None:
                mine = state.get(name)
                mine = layout.to_rows(mine) if len(old) == 1 else mine
            values[name] = _gather_rows(mine, dtype, group, cover, old, me, pool.device)
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
            if layout.sharded(name):
                value = _part_of(layout, value, full[name], rank, degree).contiguous()
            if fresh.put(name, value, row_ndim=shapes[name][2]) is None:
                fresh.free()
                raise MemoryError(f"reshard: device {device} has no room for {request_id}")
        fresh.scalars.update(scalars)
        if degree > 1:
            fresh.scalars[SHAPES] = full
    if state is not None:
        state.free()
    return fresh


def _gather_rows(mine, dtype, group, cover, old, me, device) -> torch.Tensor:
    """All token rows ``[1, S, P]`` of a token-sharded tensor on every device of ``cover``:
    each old holder contributes its rows ``mine`` (an all-gather of equal-size padded
    buffers; row counts and the row width travel first)."""
    info = torch.zeros(len(cover) + 1, dtype=torch.int64, device=device)
    if mine is not None:
        info[me] = mine.shape[1]
        info[-1] = mine.shape[2] if me == cover.index(old[0]) else 0
    dist.all_reduce(info, group=group)  # each device's row count and the width, everywhere
    sizes = info.tolist()  # control data (a few ints), before the tensor exchange
    counts, width = sizes[:-1], sizes[-1]
    padded = torch.zeros((1, max(counts), width), dtype=dtype, device=device)
    if mine is not None:
        padded.narrow(1, 0, mine.shape[1]).copy_(mine)
    bufs = [torch.empty_like(padded) for _ in cover]
    dist.all_gather(bufs, padded, group=group)
    parts = [bufs[cover.index(d)].narrow(1, 0, counts[cover.index(d)]) for d in old]
    return torch.cat(parts, 1)


def _meta(state: RequestState, layout: TokenRows) -> tuple[dict, dict, dict]:
    """(scalars without ``sp.shapes``, degree-1 shapes of the token-sharded tensors, and per
    tensor its held ``(shape, dtype, row_ndim)``) of one held part."""
    scalars = copy.deepcopy(state.scalars)
    full = scalars.pop(SHAPES, None) or {n: state.shape(n) for n in state.names()
                                         if layout.sharded(n)}
    shapes = {n: (state.shape(n), state.paged(n).dtype, len(state.paged(n).row_shape))
              for n in state.names()}
    return scalars, full, shapes


def _send_meta(meta, src: int, dsts: list[int], device) -> None:
    """Pickled ``meta`` from ``src`` to each of ``dsts`` (its length first, then the bytes)."""
    data = torch.frombuffer(bytearray(pickle.dumps(meta)), dtype=torch.uint8).to(device)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, size, d, tag=0) for d in dsts]):
        req.wait()
    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, data, d, tag=1) for d in dsts]):
        req.wait()


def _recv_meta(src: int, device):
    size = torch.empty(1, dtype=torch.int64, device=device)
    dist.batch_isend_irecv([dist.P2POp(dist.irecv, size, src, tag=0)])[0].wait()
    data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)  # control data
    dist.batch_isend_irecv([dist.P2POp(dist.irecv, data, src, tag=1)])[0].wait()
    return pickle.loads(data.cpu().numpy().tobytes())


def _row_count(layout: TokenRows, shape) -> int:
    """Token rows ``S`` of a token-sharded tensor of degree-1 ``shape`` (no data touched)."""
    return layout.to_rows(torch.empty(tuple(shape), device="meta")).shape[1]


def reshard(state: RequestState | None, device: int, old: tuple[int, ...],
            new: tuple[int, ...], pool, request_id: str,
            layout: TokenRows) -> RequestState | None:
    """Move a request held at degree ``len(old)`` on ``old`` to degree ``len(new)`` on
    ``new``, point to point between exactly the devices of ``old`` and ``new`` (global
    ranks of the default process group = device ids); ``layout``: the model's token-sharded
    tensors. Every device of ``old`` and ``new`` calls it, no other; ``state`` is this
    device's part (``None`` unless it is in ``old``). Returns this device's new part
    (``None`` unless it is in ``new``); the old part's pages are freed. ``MemoryError``
    when a new holder's pool has no room (its old part, if any, is kept)."""
    src, newcomers = old[0], [d for d in new if d not in old]
    if state is not None:
        scalars, full, shapes = _meta(state, layout)
    if newcomers and device == src:
        _send_meta((scalars, full, shapes), src, newcomers, pool.device)
    elif device in newcomers:
        scalars, full, shapes = _recv_meta(src, pool.device)
    _check_whole_steps(scalars, len(new), request_id)
    ops, received, values = [], {}, {}
    tag = 2
    for name, (shape, dtype, _) in sorted(shapes.items()):
        if not layout.sharded(name):
            if device in newcomers:
                values[name] = torch.empty(shape, dtype=dtype, device=pool.device)
                ops.append(dist.P2POp(dist.irecv, values[name], src, tag=tag))
            elif device in new:
                values[name] = state.get(name)
            if device == src:
                mine = state.get(name).contiguous()
                ops.extend(dist.P2POp(dist.isend, mine, d, tag=tag) for d in newcomers)
            tag += 1
            continue
        rows = _row_count(layout, full[name])
        was, will = bounds(rows, len(old)), bounds(rows, len(new))
        mine = None
        if state is not None:
            mine = state.get(name)
            mine = layout.to_rows(mine) if len(old) == 1 else mine
        width = None if mine is None else mine.shape[2]
        pieces = []
        for i, (a, b) in enumerate(was):
            for j, (c, e) in enumerate(will):
                lo, hi = max(a, c), min(b, e)
                if lo < hi:
                    if old[i] == device and new[j] == device:
                        pieces.append((i, mine.narrow(1, lo - a, hi - lo)))
                    elif old[i] == device:
                        ops.append(dist.P2POp(dist.isend, mine.narrow(1, lo - a, hi - lo)
                                              .contiguous(), new[j], tag=tag))
                    elif new[j] == device:
                        buf = torch.empty((1, hi - lo, _row_width(layout, full[name], width)),
                                          dtype=dtype, device=pool.device)
                        ops.append(dist.P2POp(dist.irecv, buf, old[i], tag=tag))
                        pieces.append((i, buf))
                tag += 1
        if device in new:
            received[name] = pieces
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    for name, pieces in received.items():
        part = torch.cat([p for _, p in sorted(pieces, key=lambda x: x[0])], 1)
        values[name] = part if len(new) > 1 else layout.from_rows(part, full[name])
    fresh = None
    if device in new:
        fresh = RequestState(pool, request_id=request_id)
        for name, value in values.items():
            if fresh.put(name, value.contiguous(), row_ndim=shapes[name][2]) is None:
                fresh.free()
                raise MemoryError(f"reshard: device {device} has no room for {request_id}")
        fresh.scalars.update(scalars)
        if len(new) > 1:
            fresh.scalars[SHAPES] = full
    if state is not None:
        state.free()
    return fresh


def _row_width(layout: TokenRows, shape, width: int | None) -> int:
    """``P`` of a token-sharded tensor of degree-1 ``shape`` (``width`` when known)."""
    if width is not None:
        return width
    return layout.to_rows(torch.empty(tuple(shape), device="meta")).shape[2]
