"""The point-to-point re-shard (``state_moves.reshard``) on gloo ranks: each new holder's
part equals the rows of the degree-1 state it should hold (exact), only the old and new
holders call it, and it gives what the session-5 collective (``reshard_over_group``)
gives."""

from __future__ import annotations

import numpy as np
import pytest
from ranks import run_ranks

pytestmark = pytest.mark.timeout(300)

#: a Wan-like layout: 5-D latents with a (1, 2, 2) patch, and a token-rows one (Qwen-like)
PATCH = (1, 2, 2)


def _layouts():
    from ditmem.parallel.token_rows import TokenRows

    return {"wan": TokenRows(("latents",), ("hist.",), PATCH), "qwen": TokenRows(("latents",))}


def _whole(kind: str):
    """The degree-1 state's tensors (seeded, the same on every rank)."""
    import torch

    g = torch.Generator().manual_seed(7)
    if kind == "wan":
        lat = torch.randn(1, 3, 2, 6, 10, generator=g)       # 2*3*5 = 30 tokens, P = 12
        return {"latents": lat, "hist.0": torch.randn(lat.shape, generator=g),
                "text": torch.randn(1, 5, 4, generator=g)}
    return {"latents": torch.randn(1, 29, 6, generator=g), "text": torch.randn(1, 7, 4,
                                                                          generator=g)}


def _part_at(kind, layout, devices, device):
    """What ``device`` holds of the degree-1 state at degree ``len(devices)`` (by hand)."""
    from ditmem.parallel.shards import shard

    out = {}
    for name, value in _whole(kind).items():
        if layout.sharded(name) and len(devices) > 1:
            rows = layout.to_rows(value)
            lo, hi = shard(rows.shape[1], len(devices), devices.index(device))
            value = rows[:, lo:hi]
        out[name] = value
    return out


def _state(pool, tensors: dict, full: dict | None):
    from ditmem.memory import RequestState
    from ditmem.parallel.token_rows import SHAPES

    state = RequestState(pool, request_id="r")
    for name, value in tensors.items():
        assert state.put(name, value.contiguous()) is not None
    state.scalars["step"] = 3
    if full is not None:
        state.scalars[SHAPES] = full
    return state


def _moves_rank(rank, groups, kind, moves, collective, world):
    """Along ``moves`` ((old, new) device tuples): every rank in old or new calls the
    re-shard; returns per move this rank's new part as numpy (or None)."""
    from ditmem.memory import PagePool
    from ditmem.parallel import state_moves

    layout = _layouts()[kind]
    pool = PagePool(256, 1 << 12, "cpu")
    full = {n: tuple(v.shape) for n, v in _whole(kind).items() if layout.sharded(n)}
    first = moves[0][0]
    state = None
    if rank in first:
        state = _state(pool, _part_at(kind, layout, first, rank), full if len(first) > 1
                       else None)
    out = []
    for old, new in moves:
        if collective:
            from ditmem.parallel.node import cover_group

            cover = cover_group({*old, *new}, world)
            if rank in cover:
                state = state_moves.reshard_over_group(state, groups[cover], cover, rank, old,
                                                       new, pool, "r", layout)
        elif rank in old or rank in new:
            state = state_moves.reshard(state, rank, old, new, pool, "r", layout)
        out.append(None if state is None else
                   ({n: state.get(n).numpy() for n in state.names()}, state.scalars["step"]))
    assert pool.num_used_pages == (0 if state is None else state.device_pages)
    return out


MOVES_2 = [((0,), (0, 1)), ((0, 1), (1,)), ((1,), (0,)), ((0,), (0, 1)), ((0, 1), (0,))]
MOVES_4 = [((1,), (2, 3)), ((2, 3), (0, 1)), ((0, 1), (3,)), ((3,), (0, 1, 2, 3)),
           ((0, 1, 2, 3), (2, 3)), ((2, 3), (2,))]


def _check(kind, world, moves):
    layout = _layouts()[kind]
    got = run_ranks(_moves_rank, world, (kind, moves, False, world))
    for k, (_, new) in enumerate(moves):
        for rank in range(world):
            part = got[rank][k]
            if rank not in new:
                assert part is None, f"move {k}: rank {rank} kept a part"
                continue
            tensors, step = part
            assert step == 3
            want = _part_at(kind, layout, new, rank)
            assert set(tensors) == set(want)
            for name, value in want.items():
                np.testing.assert_array_equal(tensors[name], value.numpy(),
                                              err_msg=f"move {k} rank {rank} {name}")
    return got


@pytest.mark.parametrize("kind", ["qwen", "wan"])
def test_p2p_reshard_on_two_ranks_gives_the_degree_one_rows(kind):
    _check(kind, 2, MOVES_2)


@pytest.mark.slow
def test_p2p_reshard_on_four_ranks_between_groups_equals_the_collective():
    got = _check("wan", 4, MOVES_4)
    base = run_ranks(_moves_rank, 4, ("wan", MOVES_4, True, 4))
    for rank in range(4):
        for k in range(len(MOVES_4)):
            a, b = got[rank][k], base[rank][k]
            assert (a is None) == (b is None)
            if a is not None:
                for name in a[0]:
                    np.testing.assert_array_equal(a[0][name], b[0][name])
