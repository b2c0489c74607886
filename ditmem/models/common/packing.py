"""Block-aligned packing of variable-length segments for ragged attention.

A ragged batch of B segments (requests, CFG branches) with lengths ``L_0 .. L_{B-1}`` is
kept in two layouts:

* **packed** — ``[T, ...]`` with ``T = sum(L_i)``: segment b occupies rows
  ``cu_seqlens[b] : cu_seqlens[b+1]``, no padding. Activations live here (linear layers,
  norms, MLPs never see padding). ``cu_seqlens`` is the ``cu_seqlens_q`` of
  ``ditmem.ops.paged_attention`` for queries in this layout.
* **blocked** — ``[num_blocks, block_size, ...]``: segment b starts on a block boundary and
  fills ``ceil(L_b / block_size)`` consecutive blocks; the tail of its last block is zero.
  K/V of a ragged self-attention are scattered here so that they *are* a block pool:
  ``block_table[b]`` is the consecutive range of b's blocks, ``kv_lens[b] = L_b``.

So a ragged self-attention is::

    layout = PackedLayout.build(lengths, block_size=64, device=q.device)
    out = paged_attention(q, layout.to_blocks(k), layout.to_blocks(v),
                          layout.cu_seqlens, layout.block_table, layout.kv_lens)

Row tiling (:func:`tiled`, ``MIN_ROWS``) keeps per-token layers of packed activations
batch-invariant (a request's rows get the same bits whoever shares the batch) and
cache-friendly on CPU.

``block_table`` rows are padded to ``max_blocks`` with block 0 (a real block, never read
because ``kv_lens`` bounds every request). A zero-length segment gets no block and
``kv_lens == 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch

from ditmem.ops.plan import AttentionPlan

DEFAULT_BLOCK_SIZE = 64


def blocks_for(length: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Number of blocks a segment of ``length`` rows occupies (pure arithmetic)."""
    if length < 0:
        raise ValueError(f"blocks_for: length must be >= 0, got {length}")
    if block_size <= 0:
        raise ValueError(f"blocks_for: block_size must be > 0, got {block_size}")
    return -(-length // block_size)


@dataclass(slots=True)
class PackedLayout:
    """Where each segment lives in the packed and in the blocked layout.

    lengths: per-segment row counts (python ints); block_size: rows per block;
    cu_seqlens: int32 [B+1] packed offsets; block_starts: first block of each segment
    (python ints); num_blocks: blocks in the blocked layout; block_table: int32
    [B, max_blocks]; kv_lens: int32 [B]; slots: int64 [T], row t of the packed layout goes
    to flat row ``slots[t]`` (= block * block_size + offset) of the blocked layout;
    segment_ids: int64 [T], which segment row t belongs to; plan: the validated, uploaded
    :class:`~ditmem.ops.plan.AttentionPlan` of a self-attention over this layout (its
    tensors are ``cu_seqlens``, ``block_table`` and ``kv_lens``): every layer reuses it.
    """

    lengths: list[int]
    block_size: int
    cu_seqlens: torch.Tensor
    block_starts: list[int]
    num_blocks: int
    block_table: torch.Tensor
    kv_lens: torch.Tensor
    slots: torch.Tensor
    segment_ids: torch.Tensor
    plan: AttentionPlan

    @staticmethod
    def build(
        lengths: list[int], block_size: int = DEFAULT_BLOCK_SIZE, device: torch.device | str = "cpu"
    ) -> PackedLayout:
        """Lay out segments of the given lengths (list of ints >= 0, at least one)."""
        lengths = [int(n) for n in lengths]
        if not lengths:
            raise ValueError("PackedLayout.build: lengths is empty (need at least one segment)")
        if any(n < 0 for n in lengths):
            raise ValueError(f"PackedLayout.build: negative length in lengths={lengths}")
        if block_size <= 0:
            raise ValueError(f"PackedLayout.build: block_size must be > 0, got {block_size}")
        counts = [blocks_for(n, block_size) for n in lengths]
        starts = list(accumulate(counts[:-1], initial=0))
        plan = AttentionPlan.build(
            q_lens=lengths, kv_lens=lengths, block_size=block_size, num_blocks=sum(counts),
            block_tables=[list(range(s, s + c)) for s, c in zip(starts, counts, strict=True)],
            device=device)
        if len(lengths) == 1:  # the same tensors, built with fewer ops
            n, nb = lengths[0], counts[0]
            return PackedLayout(
                lengths=lengths,
                block_size=block_size,
                cu_seqlens=plan.cu_seqlens_q,
                block_starts=[0],
                num_blocks=nb,
                block_table=plan.block_table,
                kv_lens=plan.kv_lens,
                slots=torch.arange(n, device=device),
                segment_ids=torch.zeros(n, dtype=torch.int64, device=device),
                plan=plan,
            )
        cu = list(accumulate(lengths, initial=0))
        lens_t = torch.tensor(lengths, dtype=torch.int64)
        segment_ids = torch.repeat_interleave(torch.arange(len(lengths)), lens_t)
        # row t of segment b sits at flat row starts[b] * block_size + (t - cu[b])
        shift = torch.tensor([st * block_size - c for st, c in zip(starts, cu, strict=False)])
        slots = torch.arange(cu[-1], dtype=torch.int64) + shift[segment_ids]
        return PackedLayout(
            lengths=lengths,
            block_size=block_size,
            cu_seqlens=plan.cu_seqlens_q,
            block_starts=starts,
            num_blocks=sum(counts),
            block_table=plan.block_table,
            kv_lens=plan.kv_lens,
            slots=slots.to(device),
            segment_ids=segment_ids.to(device),
            plan=plan,
        )

    def cross_plan(self, kv: PackedLayout) -> AttentionPlan:
        """The plan of queries laid out by this layout over the keys of layout ``kv`` (same
        segments in the same order: request b's queries attend to kv's segment b)."""
        if len(kv.lengths) != len(self.lengths):
            raise ValueError(f"kv: {len(kv.lengths)} segments for {len(self.lengths)} queries")
        return AttentionPlan.build(
            q_lens=self.lengths, kv_lens=kv.lengths, block_size=kv.block_size,
            num_blocks=kv.num_blocks, device=self.cu_seqlens.device,
            block_tables=[list(range(s, s + blocks_for(n, kv.block_size)))
                          for s, n in zip(kv.block_starts, kv.lengths, strict=True)])

    @property
    def total(self) -> int:
        """Rows in the packed layout, sum of lengths."""
        return int(sum(self.lengths))

    @property
    def padded_total(self) -> int:
        """Rows in the blocked layout, num_blocks * block_size."""
        return self.num_blocks * self.block_size

    def to_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """Scatter packed rows into the blocked layout.

        x: [T, *row] -> [num_blocks, block_size, *row] (same dtype/device, padding zero).
        """
        if x.shape[0] != self.total:
            raise ValueError(
                f"to_blocks: x has {x.shape[0]} rows (shape {tuple(x.shape)}), layout holds "
                f"{self.total}"
            )
        out = x.new_zeros(self.padded_total, *x.shape[1:])
        out.index_copy_(0, self.slots, x)
        return out.view(self.num_blocks, self.block_size, *x.shape[1:])

    def from_blocks(self, y: torch.Tensor) -> torch.Tensor:
        """Gather the packed rows back out of a blocked tensor.

        y: [num_blocks, block_size, *row] (or [num_blocks * block_size, *row]) -> [T, *row].
        """
        if y.dim() >= 2 and tuple(y.shape[:2]) == (self.num_blocks, self.block_size):
            flat = y.reshape(self.padded_total, *y.shape[2:])
        elif y.dim() >= 1 and y.shape[0] == self.padded_total:
            flat = y
        else:
            raise ValueError(
                f"from_blocks: y has shape {tuple(y.shape)}, expected "
                f"[{self.num_blocks}, {self.block_size}, ...] or [{self.padded_total}, ...]"
            )
        return flat.index_select(0, self.slots)

    def split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Split packed rows [T, *row] into per-segment tensors [L_b, *row]."""
        if x.shape[0] != self.total:
            raise ValueError(f"split: x has {x.shape[0]} rows, layout holds {self.total}")
        return list(torch.split(x, self.lengths, dim=0))


# BLAS (MKL sgemm) computes a row differently when a matrix has fewer than ~12 rows, so a
# request's tokens would change bits depending on who shares the batch. Packed activations
# are padded with zero rows to at least MIN_ROWS rows (models pad; per-request
# conditioning runs one row at a time for the same reason).
MIN_ROWS = 16
# Rows per linear / MLP call: large packed batches are split so outputs and the 4x-wide
# MLP hidden layer stay in cache (2-core x86 CPU, tiny-qwen-image MLP on 3248 rows: 9.8 ms
# at once, 5.4 ms in tiles of 256).
ROW_TILE = 256


def pad_to_min(x: torch.Tensor) -> torch.Tensor:
    """``x [T, ...]`` with zero rows appended up to ``MIN_ROWS`` rows (``x`` itself when it
    already has that many); same dtype and device."""
    if x.shape[0] >= MIN_ROWS:
        return x
    return torch.cat([x, x.new_zeros(MIN_ROWS - x.shape[0], *x.shape[1:])])


def tiled(fn, x: torch.Tensor, tile: int = ROW_TILE) -> torch.Tensor:
    """Apply a row-wise ``fn`` (a linear layer, an MLP) to ``x [T, ...]`` in tiles of
    ``tile`` rows so outputs and intermediates stay in cache (CPU); the tail is merged into
    the previous tile when shorter than ``MIN_ROWS``, so every call sees at least
    ``MIN_ROWS`` rows and the result equals ``fn(x)`` bit for bit."""
    n = x.shape[0]
    if n <= tile + MIN_ROWS:
        return fn(x)
    bounds = list(range(0, n, tile))
    if n - bounds[-1] < MIN_ROWS:
        bounds.pop()
    bounds.append(n)
    return torch.cat([fn(x[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])


def batch_to_blocks(
    x: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A dense batch of equal-length segments as a block pool, without index ops.

    x: [B, S, *row] -> (blocks [B * nb, block_size, *row] with nb = ceil(S / block_size),
    the tail of each segment's last block zero; block_table int32 [B, nb], segment b owns
    blocks b*nb .. b*nb+nb-1; kv_lens int32 [B], all S). The same blocks, table and lengths
    as ``PackedLayout.build([S] * B, block_size)`` gives (segments start on block
    boundaries, in order).
    """
    batch, seq = x.shape[0], x.shape[1]
    nb = max(1, blocks_for(seq, block_size))
    if nb * block_size != seq:
        x = torch.cat([x, x.new_zeros(batch, nb * block_size - seq, *x.shape[2:])], 1)
    blocks = x.reshape(batch * nb, block_size, *x.shape[2:])
    table = torch.arange(batch * nb, dtype=torch.int32, device=x.device).view(batch, nb)
    lens = torch.full((batch,), seq, dtype=torch.int32, device=x.device)
    return blocks, table, lens


def rowwise_linear(linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear`` applied to each row of ``x [B, in]`` as its own one-row product, in ONE
    call (a batched matrix product against the weight broadcast over B): row b gets the
    bits of ``linear(x[b:b+1])`` whatever B is, so per-request conditioning (timestep
    embedding, modulation) does not depend on which requests share the batch, and a single
    request computes exactly what the stock model computes. Returns ``[B, out]``."""
    if x.shape[0] == 1:
        return linear(x)
    w = linear.weight.t()
    w = w.expand(x.shape[0], *w.shape)
    if linear.bias is None:
        return torch.bmm(x[:, None], w)[:, 0]
    return torch.baddbmm(linear.bias.expand(x.shape[0], 1, -1), x[:, None], w)[:, 0]


def rowwise(layers, x: torch.Tensor) -> torch.Tensor:
    """A chain of ``layers`` (``nn.Linear`` and row-wise activations) over ``x [B, in]``,
    every linear through :func:`rowwise_linear`."""
    for layer in layers:
        x = rowwise_linear(layer, x) if isinstance(layer, torch.nn.Linear) else layer(x)
    return x
