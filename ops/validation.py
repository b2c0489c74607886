"""Input checks for the public ops: raise ValueError naming the argument and its shape.

Shape/dtype/device checks are free (metadata only). Value checks (block ids in range,
kv_lens within the table, cu_seqlens monotone) read small int tensors; they are combined
into one host read per call so a CUDA/NPU caller pays a single small sync. Small CPU index
tensors are checked as Python lists instead (a dozen tiny tensor ops cost more than the
check itself: ~75 µs per call, a few % of a tiny model's forward).
"""

from __future__ import annotations

import torch

from ditmem.ops.plan import HostIndex

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
#: Index tensors up to this many entries, on the CPU, are value-checked as Python lists.
SMALL_INDEX = 4096


def _desc(name: str, t: torch.Tensor) -> str:
    return f"{name} (shape {tuple(t.shape)}, {t.dtype}, {t.device})"


def _need(cond: bool, msg) -> None:
    """ValueError(msg) unless ``cond``; ``msg`` may be a callable building the message only
    on failure (the descriptions format shapes, too slow to build on every call)."""
    if not cond:
        raise ValueError(msg() if callable(msg) else msg)


def _tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):  # the message is only built on failure
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _index(name: str, t: object, rank: int, device: torch.device) -> torch.Tensor:
    t = _tensor(name, t)
    _need(t.dim() == rank, lambda: f"{_desc(name, t)} must have rank {rank}")
    _need(t.dtype in INDEX_DTYPES, lambda: f"{_desc(name, t)} must be int32 or int64")
    _need(t.device == device, lambda: f"{_desc(name, t)} must be on {device}")
    return t


def _used_blocks_mask(block_table: torch.Tensor, lens: torch.Tensor, block_size: int):
    """[B, max_blocks] bool: the table entries that hold some of the first lens[b] rows."""
    needed = (lens.to(torch.int64) + block_size - 1) // block_size
    cols = torch.arange(block_table.shape[1], device=block_table.device)
    return cols[None, :] < needed[:, None]


def _table_problems(block_table, lens, num_blocks, block_size, lens_name):
    """Bool tensors (0-dim) flagging bad lens / block ids, and their messages."""
    capacity = block_table.shape[1] * block_size
    if lens.numel() == 0:
        return [], []
    used = _used_blocks_mask(block_table, lens, block_size)
    bad_ids = used & ((block_table < 0) | (block_table >= num_blocks))
    flags = [(lens < 0).any(), (lens > capacity).any(), bad_ids.any()]
    msgs = [
        f"{lens_name} has negative entries",
        f"{lens_name} exceeds the block table's capacity ({block_table.shape[1]} blocks x "
        f"{block_size} rows = {capacity})",
        f"block_table (shape {tuple(block_table.shape)}) holds block ids outside "
        f"[0, {num_blocks}) in the blocks covered by {lens_name}",
    ]
    return flags, msgs


def _table_messages(rows: list, lens: list, num_blocks: int, block_size: int,
                    width: int, lens_name: str, table_shape) -> list[str]:
    """What :func:`_table_problems` flags, from Python lists (small CPU tensors)."""
    capacity = width * block_size
    out = []
    if any(n < 0 for n in lens):
        out.append(f"{lens_name} has negative entries")
    if any(n > capacity for n in lens):
        out.append(f"{lens_name} exceeds the block table's capacity ({width} blocks x "
                   f"{block_size} rows = {capacity})")
    for row, n in zip(rows, lens, strict=True):
        used = row[:max(0, -(-n // block_size))]
        if any(b < 0 or b >= num_blocks for b in used):
            out.append(f"block_table (shape {tuple(table_shape)}) holds block ids outside "
                       f"[0, {num_blocks}) in the blocks covered by {lens_name}")
            break
    return out


def _small_cpu(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.numel() <= SMALL_INDEX for t in tensors)


def _raise_flagged(flags: list[torch.Tensor], msgs: list[str]) -> None:
    if not flags or torch.compiler.is_compiling():  # no host reads inside a compiled graph
        return
    values = torch.stack(flags).tolist()  # the one host read
    for bad, msg in zip(values, msgs, strict=True):
        _need(not bad, msg)


def check_paged_attention(q, k_cache, v_cache, cu_seqlens_q, block_table, kv_lens, scale):
    """Validate paged_attention's inputs (see ditmem.ops.paged_attention for shapes); returns
    the :class:`HostIndex` read on the way (one host read in all), or None when compiling."""
    check_attention_operands(q, k_cache, v_cache, scale)
    cu = _index("cu_seqlens_q", cu_seqlens_q, 1, q.device)
    _need(cu.numel() >= 1, lambda: f"{_desc('cu_seqlens_q', cu)} must have B+1 >= 1 entries")
    batch = cu.numel() - 1
    bt = _index("block_table", block_table, 2, q.device)
    lens = _index("kv_lens", kv_lens, 1, q.device)
    _need(bt.shape[0] == batch, lambda: f"{_desc('block_table', bt)} must have B={batch} rows")
    _need(lens.shape[0] == batch, lambda: f"{_desc('kv_lens', lens)} must have B={batch} entries")
    if torch.compiler.is_compiling():  # no host reads inside a compiled graph
        return None
    if _small_cpu(cu, bt, lens):
        cus, lens_list = cu.tolist(), lens.tolist()
        msgs = _table_messages(bt.tolist(), lens_list, k_cache.shape[0], k_cache.shape[1],
                               bt.shape[1], "kv_lens", bt.shape)
    else:
        flags, names = _table_problems(bt, lens, k_cache.shape[0], k_cache.shape[1], "kv_lens")
        values = torch.cat([torch.stack(flags).to(torch.int64), cu.to(torch.int64),
                            lens.to(torch.int64)]).tolist()  # the one host read
        msgs = [m for bad, m in zip(values, names, strict=False) if bad]
        cus = values[len(flags) : len(flags) + batch + 1]
        lens_list = values[len(flags) + batch + 1 :]
    if cus[0] != 0:
        msgs.append(f"{_desc('cu_seqlens_q', cu)} must start at 0")
    if any(b < a for a, b in zip(cus, cus[1:], strict=False)):
        msgs.append(f"{_desc('cu_seqlens_q', cu)} must be non-decreasing")
    if cus[-1] != q.shape[0]:
        msgs.append(f"{_desc('cu_seqlens_q', cu)} must end at total_q={q.shape[0]}")
    _need(not msgs, msgs[0] if msgs else "")
    return HostIndex.from_lists(cus, lens_list)


def check_planned_attention(q, k_cache, v_cache, plan, scale) -> None:
    """Validate planned_attention's operands against an :class:`AttentionPlan` (metadata
    only: the plan's values were checked when it was built; no host read)."""
    from ditmem.ops.plan import AttentionPlan

    if not isinstance(plan, AttentionPlan):
        raise ValueError(f"plan must be an AttentionPlan, got {type(plan).__name__}")
    check_attention_operands(q, k_cache, v_cache, scale)
    _need(q.shape[0] == plan.total_q,
          lambda: f"{_desc('q', q)} must have the plan's total_q={plan.total_q} rows")
    _need(k_cache.shape[1] == plan.block_size,
          lambda: f"{_desc('k_cache', k_cache)} block_size must be the plan's {plan.block_size}")
    _need(k_cache.shape[0] >= plan.min_blocks,
          lambda: f"{_desc('k_cache', k_cache)} has fewer blocks than the plan reads "
                  f"({plan.min_blocks})")
    _need(plan.kv_lens.device == q.device,
          lambda: f"plan (on {plan.kv_lens.device}) must be on q's device {q.device}")


def check_attention_operands(q, k_cache, v_cache, scale) -> None:
    """Shapes, dtypes and devices of q, k_cache, v_cache and the scale (metadata only)."""
    q = _tensor("q", q)
    _need(q.dim() == 3, lambda: f"{_desc('q', q)} must be [total_q, num_heads, head_dim]")
    _need(q.dtype in FLOAT_DTYPES, lambda: f"{_desc('q', q)} must be float32, float16 or bfloat16")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        c = _tensor(name, c)
        _need(
            c.dim() == 4,
            lambda name=name, c=c: (
                f"{_desc(name, c)} must be [num_blocks, block_size, num_kv_heads, head_dim]"
            ),
        )
        _need(c.dtype == q.dtype,
              lambda name=name, c=c: f"{_desc(name, c)} must have q's dtype {q.dtype}")
        _need(c.device == q.device,
              lambda name=name, c=c: f"{_desc(name, c)} must be on q's device {q.device}")
    _need(
        k_cache.shape == v_cache.shape,
        lambda: f"{_desc('v_cache', v_cache)} must have k_cache's shape {tuple(k_cache.shape)}",
    )
    _need(
        k_cache.shape[3] == q.shape[2],
        lambda: f"{_desc('k_cache', k_cache)} head_dim must equal q's head_dim {q.shape[2]}",
    )
    _need(k_cache.shape[1] > 0, lambda: f"{_desc('k_cache', k_cache)} block_size must be positive")
    num_kv_heads = k_cache.shape[2]
    _need(
        num_kv_heads > 0 and q.shape[1] % num_kv_heads == 0,
        lambda: f"{_desc('q', q)} num_heads must be a multiple of num_kv_heads={num_kv_heads}",
    )
    if scale is not None:
        _need(
            isinstance(scale, (int, float)) and scale > 0 and scale != float("inf"),
            lambda: f"scale must be a positive finite float, got {scale!r}",
        )


def check_write_blocks(x, cache, slot_mapping):
    """Validate write_blocks' inputs (x may be on another device: the op moves it)."""
    x = _tensor("x", x)
    cache = _tensor("cache", cache)
    _need(x.dim() >= 1, lambda: f"{_desc('x', x)} must be [T, *row]")
    _need(
        cache.dim() == x.dim() + 1 and cache.shape[2:] == x.shape[1:],
        lambda: f"{_desc('cache', cache)} must be [num_blocks, block_size, *{tuple(x.shape[1:])}] "
        f"to take rows of {_desc('x', x)}",
    )
    slots = _index("slot_mapping", slot_mapping, 1, cache.device)
    _need(
        slots.shape[0] == x.shape[0],
        lambda: f"{_desc('slot_mapping', slots)} must have one slot per row of x ({x.shape[0]})",
    )
    num_slots = cache.shape[0] * cache.shape[1]
    if slots.numel():
        _raise_flagged(
            [((slots < -1) | (slots >= num_slots)).any()],
            [f"{_desc('slot_mapping', slots)} entries must be -1 or in [0, {num_slots})"],
        )


def check_gather_blocks(cache, block_table, lens) -> int | None:
    """Validate gather_blocks' inputs; returns sum(lens) (read with the checks, in one host
    read), or None when compiling."""
    cache = _tensor("cache", cache)
    _need(cache.dim() >= 2,
          lambda: f"{_desc('cache', cache)} must be [num_blocks, block_size, *row]")
    bt = _index("block_table", block_table, 2, cache.device)
    lens = _index("lens", lens, 1, cache.device)
    _need(bt.shape[0] == lens.shape[0],
          lambda: f"{_desc('block_table', bt)} must have B={len(lens)} rows")
    if torch.compiler.is_compiling():
        return None
    flags, msgs = _table_problems(bt, lens, cache.shape[0], cache.shape[1], "lens")
    values = torch.stack([*(f.to(torch.int64) for f in flags),
                          lens.to(torch.int64).sum()]).tolist()  # the one host read
    for bad, msg in zip(values, msgs, strict=False):
        _need(not bad, msg)
    return values[-1]


def check_copy_blocks(src, dst, mapping):
    """Validate copy_blocks' inputs (src and dst may be on different devices).

    This sits on the offload path, called once per transfer: messages are only formatted
    on failure, and the block-id range check is one whole-tensor ``aminmax`` and one host
    read when every id is below both block counts (exact: such an id is valid on either
    side); only otherwise are the columns checked one by one, to accept ids that are valid
    for their own side and to name the side that is out of range.
    """
    src = _tensor("src", src)
    dst = _tensor("dst", dst)
    m = _tensor("mapping", mapping)
    if src.dim() < 1:
        raise ValueError(f"{_desc('src', src)} must be [num_blocks, ...]")
    if dst.dim() != src.dim() or dst.shape[1:] != src.shape[1:]:
        raise ValueError(
            f"{_desc('dst', dst)} must have src's block shape {tuple(src.shape[1:])}"
        )
    if dst.dtype != src.dtype:
        raise ValueError(f"{_desc('dst', dst)} must have src's dtype {src.dtype}")
    if m.dim() != 2 or m.shape[1] != 2 or m.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"{_desc('mapping', m)} must be an int64 [N, 2] tensor of (src block, dst block)"
        )
    if m.numel() == 0 or torch.compiler.is_compiling():
        return
    n_src, n_dst = src.shape[0], dst.shape[0]
    lo, hi = _host_pair(*m.aminmax())
    if lo >= 0 and hi < min(n_src, n_dst):
        return
    lo, hi = m.aminmax(dim=0)
    (lo_src, lo_dst), (hi_src, hi_dst) = _host_pair(lo, hi)
    if lo_src < 0 or hi_src >= n_src:
        raise ValueError(f"{_desc('mapping', m)} has src block ids outside [0, {n_src})")
    if lo_dst < 0 or hi_dst >= n_dst:
        raise ValueError(f"{_desc('mapping', m)} has dst block ids outside [0, {n_dst})")


def _host_pair(a: torch.Tensor, b: torch.Tensor):
    """``a`` and ``b`` (same shape) as Python numbers or lists, in one host read (CPU
    tensors are read directly)."""
    if a.device.type == "cpu":
        return a.tolist(), b.tolist()
    return torch.stack([a, b]).tolist()
