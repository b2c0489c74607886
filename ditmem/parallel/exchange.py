"""The Ulysses exchange of a sequence-parallel packed step.

Between attention layers every rank of a group of ``degree`` ranks holds its token shard
of every request (:mod:`ditmem.parallel.shards`) with all heads; linear layers, norms,
modulation and MLPs run on those rows only. Around attention, :class:`HeadExchange` moves
Q/K/V to *all* tokens of the batch for ``num_heads / degree`` heads (one
``all_to_all_single`` for every stream at once) and the attention output back to the
rank's tokens with all heads (one more). In between each rank runs
``ditmem.ops.paged_attention`` over the whole ragged sequence for its heads, with the
unchanged packed layout.

All row orders are fixed when the exchange is built (once per step, from the requests'
lengths: python ints, no device reads) and the group is created once at start; nothing
on the hot path reads a device value on the host.

Row orders of one stream ``s`` (requests ``b`` back to back):

* *full*: the packed order of a degree-1 step (request b's rows ``cu[b] .. cu[b+1]``);
* *local* on rank j: ``shard_j(b0), shard_j(b1), ...`` (what the rank's activations hold);
* *received*: what ``all_to_all_single`` delivers: for each source rank j, its local rows
  of every stream in stream order.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.distributed as dist

from ditmem.parallel.shards import bounds


def _maybe_index(rows: list[int], device) -> torch.Tensor | None:
    """``rows`` as an int64 index tensor, or ``None`` when it is the identity."""
    if rows == list(range(len(rows))):
        return None
    return torch.tensor(rows, dtype=torch.int64, device=device)


def _take(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    return x if index is None else x.index_select(0, index)


@dataclass(slots=True, eq=False)
class HeadExchange:
    """All-to-all between token shards and head shards for one packed step.

    group: the process group (ranks of one aligned device group, created once); rank: this
    process's rank in it; degree: its size; heads: this rank's head range (a slice of
    ``num_heads``); counts: ``counts[s][j]`` rows of stream ``s`` on rank ``j``;
    recv_index[s]: rows of the received buffer in stream s's full order; send_index: rows of
    the streams' full outputs (concatenated) in sending order (``None``: identity);
    gather_index[s]: rows of stream s's ranks-in-order concatenation in full order.
    """

    group: object
    rank: int
    degree: int
    heads: slice
    counts: list[list[int]]
    recv_index: list[torch.Tensor | None]
    send_index: torch.Tensor | None
    gather_index: list[torch.Tensor | None]

    @staticmethod
    def build(group, rank: int, degree: int, streams: list[list[int]], num_heads: int,
              device) -> HeadExchange:
        """streams: per stream, the full row count of each request (the same requests in
        the same order in every stream). ``num_heads`` must be a multiple of ``degree``."""
        if degree < 2:
            raise ValueError(f"HeadExchange: degree must be >= 2 (degree 1 needs no exchange), "
                             f"got {degree}")
        if num_heads % degree:
            raise ValueError(f"HeadExchange: num_heads {num_heads} is not a multiple of the "
                             f"degree {degree}")
        if not 0 <= rank < degree:
            raise ValueError(f"HeadExchange: rank {rank} is not in [0, {degree})")
        cuts = [[bounds(n, degree) for n in lens] for lens in streams]  # [s][b][j]
        counts = [[sum(hi - lo for lo, hi in (c[j] for c in per_req)) for j in range(degree)]
                  for per_req in cuts]
        per_rank = [sum(counts[s][j] for s in range(len(streams))) for j in range(degree)]
        rank_off = list(accumulate(per_rank, initial=0))
        recv, gather = [], []
        for s, per_req in enumerate(cuts):
            stream_off = [rank_off[j] + sum(counts[t][j] for t in range(s))
                          for j in range(degree)]
            own_off = list(accumulate(counts[s], initial=0))
            seen = [0] * degree  # rows of earlier requests in rank j's local stream
            rows_recv, rows_gather = [], []
            for c in per_req:
                for j, (lo, hi) in enumerate(c):
                    rows_recv.extend(range(stream_off[j] + seen[j], stream_off[j] + seen[j]
                                           + hi - lo))
                    rows_gather.extend(range(own_off[j] + seen[j], own_off[j] + seen[j]
                                             + hi - lo))
                    seen[j] += hi - lo
            recv.append(_maybe_index(rows_recv, device))
            gather.append(_maybe_index(rows_gather, device))
        stream_start = list(accumulate((sum(lens) for lens in streams), initial=0))
        send = []
        for j in range(degree):
            for s, (lens, per_req) in enumerate(zip(streams, cuts, strict=True)):
                first = list(accumulate(lens, initial=0))
                for b, c in enumerate(per_req):
                    lo, hi = c[j]
                    send.extend(range(stream_start[s] + first[b] + lo,
                                      stream_start[s] + first[b] + hi))
        per = num_heads // degree
        return HeadExchange(group, rank, degree, slice(rank * per, (rank + 1) * per), counts,
                            recv, _maybe_index(send, device), gather)

    @property
    def local_rows(self) -> tuple[int, ...]:
        """This rank's real rows of each stream."""
        return tuple(c[self.rank] for c in self.counts)

    def _per_rank(self) -> list[int]:
        return [sum(c[j] for c in self.counts) for j in range(self.degree)]

    def to_heads(self, parts: list[torch.Tensor]) -> list[tuple[torch.Tensor, ...]]:
        """Token shards -> head shards, every stream in ONE all-to-all.

        parts[s]: ``[local_rows[s], K, H, D]`` (K tensors stacked, e.g. Q/K/V). Returns per
        stream the K tensors ``[T_s, H / degree, D]`` over the stream's full order.
        """
        d = self.degree
        x = torch.cat(parts) if len(parts) > 1 else parts[0]
        n, k, h, hd = x.shape
        if h % d:
            raise ValueError(f"to_heads: {h} heads do not split over degree {d}")
        send = x.view(n, k, d, h // d, hd).permute(2, 0, 1, 3, 4).contiguous()
        sizes = self._per_rank()
        recv = x.new_empty(sum(sizes), k, h // d, hd)
        dist.all_to_all_single(recv, send.view(d * n, k, h // d, hd), sizes, [n] * d,
                               group=self.group)
        return [_take(recv, idx).unbind(1) for idx in self.recv_index]

    def to_tokens(self, parts: list[torch.Tensor]) -> list[torch.Tensor]:
        """Head shards -> token shards, every stream in ONE all-to-all.

        parts[s]: ``[T_s, C, ...]`` in full order (this rank's heads folded into C or kept
        as ``[H / degree, D]``). Returns per stream ``[local_rows[s], degree * C, ...]`` with
        the heads in order.
        """
        d = self.degree
        y = torch.cat(parts) if len(parts) > 1 else parts[0]
        y = _take(y, self.send_index).contiguous()
        n = sum(self.local_rows)
        recv = y.new_empty(d * n, *y.shape[1:])
        dist.all_to_all_single(recv, y, [n] * d, self._per_rank(), group=self.group)
        out = recv.view(d, n, *y.shape[1:]).movedim(0, 1).flatten(1, 2)
        return list(torch.split(out, list(self.local_rows)))

    def gather(self, local: torch.Tensor, stream: int = 0) -> torch.Tensor:
        """This rank's rows ``[local_rows[stream], ...]`` of one stream -> the whole stream
        ``[T_s, ...]`` in full order on every rank (an all-gather; for outputs that must be
        whole, e.g. Wan's unpatchify)."""
        counts = self.counts[stream]
        width = max(counts)
        padded = local.new_zeros(width, *local.shape[1:])
        padded[: local.shape[0]] = local
        bufs = [torch.empty_like(padded) for _ in range(self.degree)]
        dist.all_gather(bufs, padded, group=self.group)
        joined = torch.cat([b[:n] for b, n in zip(bufs, counts, strict=True)])
        return _take(joined, self.gather_index[stream])
