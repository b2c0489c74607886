"""How a request's tokens are split over the ranks of a sequence-parallel group (pure
arithmetic, no torch).

Every request is split on its own: rank ``r`` of ``degree`` holds rows
``bounds(n, degree)[r]`` of each of its token streams (Qwen-Image: image and valid text
tokens; Wan: video tokens). Shards are contiguous and differ in size by at most one row,
so a request's shard depends only on its own length and the degree, never on which
requests share the step: its paged state can stay sharded across steps.
"""

from __future__ import annotations


def bounds(n: int, degree: int) -> list[tuple[int, int]]:
    """``degree`` contiguous ``(lo, hi)`` row ranges covering ``0 .. n`` (sizes differ by at
    most one; later ranks get the larger ones)."""
    if n < 0:
        raise ValueError(f"bounds: n must be >= 0, got {n}")
    if degree < 1:
        raise ValueError(f"bounds: degree must be >= 1, got {degree}")
    cuts = [(r * n) // degree for r in range(degree + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def shard(n: int, degree: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s ``(lo, hi)`` of ``bounds(n, degree)``."""
    if not 0 <= rank < degree:
        raise ValueError(f"shard: rank {rank} is not in [0, {degree})")
    return bounds(n, degree)[rank]


def shard_lens(lens: list[int], degree: int, rank: int) -> list[int]:
    """Rows of each request (``lens``) that rank ``rank`` holds."""
    return [hi - lo for lo, hi in (shard(n, degree, rank) for n in lens)]
