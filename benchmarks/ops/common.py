"""Shared helpers of the ops benchmarks: ragged paged batches, timing, tables, JSON."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class PagedBatch:
    """A ragged batch with shuffled pages plus the same K/V per request, contiguous."""

    q: torch.Tensor  # [total_q, H, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, H_kv, D]
    v_cache: torch.Tensor
    cu_seqlens_q: torch.Tensor  # int32 [B+1]
    block_table: torch.Tensor  # int32 [B, max_blocks]
    kv_lens: torch.Tensor  # int32 [B]
    k_dense: list[torch.Tensor]  # per request [1, H_kv, L_b, D], contiguous
    v_dense: list[torch.Tensor]


def make_batch(q_lens, kv_lens, heads, kv_heads, dim, block_size, dtype, seed=0) -> PagedBatch:
    """Random batch; each request's pages are a random subset of a shuffled pool."""
    g = torch.Generator().manual_seed(seed)
    blocks = [-(-n // block_size) for n in kv_lens]
    num_blocks = sum(blocks) + 1
    perm = torch.randperm(num_blocks, generator=g)
    table = torch.zeros(len(kv_lens), max(max(blocks), 1), dtype=torch.int32)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g).to(dtype)
    k_dense, v_dense, used = [], [], 0
    for b, (n, nb) in enumerate(zip(kv_lens, blocks, strict=True)):
        ids = perm[used : used + nb]
        used += nb
        table[b, :nb] = ids
        k = k_cache[ids].reshape(-1, kv_heads, dim)[:n]
        v = v_cache[ids].reshape(-1, kv_heads, dim)[:n]
        k_dense.append(k.transpose(0, 1).unsqueeze(0).contiguous())
        v_dense.append(v.transpose(0, 1).unsqueeze(0).contiguous())
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(q_lens).cumsum(0)
    q = torch.randn(int(cu[-1]), heads, dim, generator=g).to(dtype)
    return PagedBatch(q, k_cache, v_cache, cu, table, torch.tensor(kv_lens, dtype=torch.int32),
                      k_dense, v_dense)


def sdpa_per_request(batch: PagedBatch) -> list[torch.Tensor]:
    """The baseline: one torch SDPA call per request on contiguous K/V (as diffusers does)."""
    cu = batch.cu_seqlens_q.tolist()
    gqa = batch.q.shape[1] != batch.k_cache.shape[2]
    outs = []
    for b in range(len(batch.k_dense)):
        qb = batch.q[cu[b] : cu[b + 1]].transpose(0, 1).unsqueeze(0)
        outs.append(torch.nn.functional.scaled_dot_product_attention(
            qb, batch.k_dense[b], batch.v_dense[b], enable_gqa=gqa))
    return outs


def attention_flops(q_lens, kv_lens, heads, dim) -> float:
    return sum(4.0 * a * b * heads * dim for a, b in zip(q_lens, kv_lens, strict=True))



def samples(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each call, interleaving the functions on every repeat so that machine
    noise hits all of them alike (after one warm-up call each)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def side_by_side(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds per function, measured interleaved (see samples)."""
    return {name: statistics.median(ts) for name, ts in samples(fns, repeats).items()}


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small shapes, few repeats")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (median)")
    return p


def machine() -> str:
    return f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}"


def report(title: str, rows: list[dict], path: str | None) -> None:
    """Print rows as an aligned table; write {title, machine, rows} to path if given."""
    print(f"# {title} ({machine()})")
    if rows:
        cols = list(rows[0])
        cells = [[_fmt(r[c]) for c in cols] for r in rows]
        widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
        print("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
        for line in cells:
            print("  ".join(x.rjust(w) for x, w in zip(line, widths, strict=True)))
    if path:
        with open(path, "w") as f:
            json.dump({"title": title, "machine": machine(), "rows": rows}, f, indent=2)


def _fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else str(x)
