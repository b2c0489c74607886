"""OffloadEngine: round trips, restore into other pages, cancel, no room, errors."""

import pytest
import torch

from ditmem.memory import (
    HostPool,
    HostPoolExhausted,
    OffloadEngine,
    PagePool,
    TensorState,
    TensorStateError,
    TransferError,
)
from ditmem.memory.copy_plan import MIN_GRANULE

MODES = ["sync", "thread"]


def setup(mode, num_pages=32, host_pages=64, page_bytes=256):
    pool = PagePool(num_pages=num_pages, page_bytes=page_bytes)
    host = HostPool(num_pages=host_pages, page_bytes=page_bytes)
    return pool, host, OffloadEngine(pool, host, mode=mode)


@pytest.mark.parametrize("mode", MODES)
def test_roundtrip_lands_in_other_pages_bit_exact(mode):
    pool, host, eng = setup(mode)
    a = pool.allocate_tensor(40, (3,), torch.bfloat16)
    b = pool.allocate_tensor(10, (), torch.float32)
    xa, xb = torch.randn(40, 3).bfloat16(), torch.randn(10)
    a.write(xa)
    b.write(xb)
    old_pages = set(a.pages) | set(b.pages)
    for _ in range(3):  # back and forth several times
        h = eng.start_offload([a, b])
        assert a.state is TensorState.OFFLOADING
        with pytest.raises(TensorStateError):
            a.write(xa)
        eng.finish_offload(h)
        assert a.state is TensorState.ON_HOST and b.state is TensorState.ON_HOST
        assert pool.num_free_pages == 32
        assert torch.equal(a.read(), xa)  # readable on the host
        filler = pool.allocate(len(old_pages))  # take exactly the old pages
        assert set(filler) == old_pages
        h = eng.start_restore([a, b])
        eng.finish_restore(h)
        assert not (set(a.pages) | set(b.pages)) & old_pages
        assert torch.equal(a.read(), xa) and torch.equal(b.read(), xb)
        pool.free(filler)
        old_pages = set(a.pages) | set(b.pages)
    assert host.num_free_pages == 64
    eng.close()


@pytest.mark.parametrize("mode", MODES)
def test_cancel_leaves_tensor_where_it_was(mode):
    pool, host, eng = setup(mode)
    t = pool.allocate_tensor(50, (), torch.float32)
    x = torch.randn(50)
    t.write(x)
    pages = t.pages
    h = eng.start_offload([t])
    while not eng.ready(h):  # polling never blocks; the copy completes on its own
        pass
    eng.cancel(h)
    assert t.state is TensorState.ON_DEVICE and t.pages == pages
    assert torch.equal(t.read(), x) and host.num_free_pages == 64
    with pytest.raises(TransferError):
        eng.finish_offload(h)
    eng.offload([t])
    free = pool.num_free_pages
    h = eng.start_restore([t])
    assert pool.num_free_pages == free - t.num_pages  # destination pages are reserved
    eng.cancel(h)
    assert t.state is TensorState.ON_HOST and pool.num_free_pages == free
    assert torch.equal(t.read(), x)
    assert eng.restore([t]) and torch.equal(t.read(), x)
    assert eng.num_in_flight == 0
    eng.close()


def test_restore_without_room_returns_none_and_keeps_data():
    pool, host, eng = setup("sync", num_pages=4)
    t = pool.allocate_tensor(4 * 64, (), torch.float32)  # all 4 pages
    x = torch.randn(4 * 64)
    t.write(x)
    eng.offload([t])
    blocker = pool.allocate(1)
    assert eng.start_restore([t]) is None
    assert not eng.restore([t])
    assert t.state is TensorState.ON_HOST and torch.equal(t.read(), x)
    assert pool.num_free_pages == 3
    pool.free(blocker)
    assert eng.restore([t]) and torch.equal(t.read(), x)


def test_host_exhausted_raises_and_changes_nothing():
    pool, host, eng = setup("sync", host_pages=2)
    t = pool.allocate_tensor(3 * 64, (), torch.float32)
    x = torch.randn(3 * 64)
    t.write(x)
    with pytest.raises(HostPoolExhausted, match="host pool"):
        eng.start_offload([t])
    assert t.state is TensorState.ON_DEVICE and torch.equal(t.read(), x)
    assert host.num_free_pages == 2 and eng.num_in_flight == 0


def test_misuse_is_rejected():
    pool, host, eng = setup("sync")
    other = PagePool(num_pages=4, page_bytes=256)
    t = pool.allocate_tensor(8, (), torch.float32)
    with pytest.raises(ValueError, match="another pool"):
        eng.start_offload([other.allocate_tensor(1, (), torch.float32)])
    with pytest.raises(ValueError, match="twice"):
        eng.start_offload([t, t])
    with pytest.raises(TensorStateError):
        eng.start_restore([t])
    h = eng.start_offload([t])
    with pytest.raises(TensorStateError):
        t.free()
    with pytest.raises(TransferError):
        eng.finish_restore(h)
    eng.finish_offload(h)
    with pytest.raises(TransferError, match="finished"):
        eng.cancel(h)
    with pytest.raises(ValueError, match="page_bytes"):
        OffloadEngine(pool, HostPool(num_pages=4, page_bytes=512))
    with pytest.raises(ValueError, match="mode"):
        OffloadEngine(pool, host, mode="warp")
    t.free()  # freeing on the host releases host pages
    assert host.num_free_pages == 64


def test_block_ids_trim_last_pages_to_granules():
    from ditmem.memory.copy_plan import block_ids, granule_for, pairs

    page = 1 << 16
    assert granule_for(page, trim=False) == page
    assert granule_for(page, trim=True, wanted=1 << 14) == 1 << 14
    assert granule_for(page, trim=True, wanted=3 << 13) == 1 << 14  # a power of two
    assert granule_for(page, trim=True, wanted=page) == page
    assert granule_for(4096 + 16, trim=True) == 4096 + 16  # no useful power-of-two divisor
    with pytest.raises(ValueError, match="trim_granule"):
        OffloadEngine(PagePool(num_pages=2, page_bytes=page), HostPool(2, page), trim_granule=0)
    pool = PagePool(num_pages=16, page_bytes=page)
    a = pool.allocate_tensor(3 * (page // 4) - 100, (), torch.float32)  # 3 pages, 65136 B tail
    b = pool.allocate_tensor(10, (5,), torch.int64)  # 400 bytes in one page
    e = pool.allocate_tensor(0, (), torch.float32)  # no pages
    assert (a.last_page_bytes, b.last_page_bytes, e.last_page_bytes) == (page - 400, 400, 0)
    src = [a.pages, b.pages, e.pages]
    dst = [[7, 8, 9], [3], []]
    g = 1 << 14  # k = 4 granules per page
    s_ids, d_ids = block_ids([a, b, e], src, dst, page, g)
    want = [[4 * s + j, 4 * d + j]
            for s, d in zip(a.pages, [7, 8, 9], strict=True) for j in range(4)]
    want += [[4 * b.pages[0], 12]]  # 400 bytes: the first granule only
    m = pairs(s_ids, d_ids)
    assert m.dtype == torch.int64 and m.tolist() == want
    whole = pairs(*block_ids([a, b, e], src, dst, page, page))
    assert whole.tolist() == [[s, d] for s, d in zip(a.pages + b.pages, [7, 8, 9, 3],
                                                        strict=True)]
    a2 = pool.allocate_tensor(2 * (page // 4) + 10, (), torch.float32)  # 40 B in page 3
    m2 = pairs(*block_ids([b, a2], [b.pages, a2.pages], [[5], [0, 1, 2]], page, g))
    assert m2.shape == (10, 2) and m2[0].tolist() == [4 * b.pages[0], 20]
    assert m2[-1].tolist() == [4 * a2.pages[2], 8]
    assert block_ids([e], [[]], [[]], page, g) == ([], [])


def test_mapping_buffer_reuses_views_and_refuses_overflow():
    from ditmem.memory.copy_plan import MappingBuffer

    buf = MappingBuffer(capacity=4)
    m = buf.fill([1, 2, 3], [4, 5, 6])
    assert m.dtype == torch.int64 and m.tolist() == [[1, 4], [2, 5], [3, 6]]
    again = buf.fill([7, 8, 9], [0, 1, 2])
    assert again is m and m.tolist() == [[7, 0], [8, 1], [9, 2]]
    assert buf.fill([1], [2]).tolist() == [[1, 2]]
    assert buf.fill(list(range(5)), list(range(5))) is None


def test_transfers_in_flight_never_share_a_mapping():
    """The engine's reusable mapping buffer is only used while nothing else is in flight."""
    import threading

    from ditmem.ops import copy_blocks as ops_copy

    pool, host, _ = setup("thread", page_bytes=4096)
    release = threading.Event()
    seen = []

    def gated_copy(src, dst, mapping):
        release.wait(5)
        seen.append(mapping)
        ops_copy(src, dst, mapping)

    eng = OffloadEngine(pool, host, mode="thread", copy_fn=gated_copy)
    xs = [torch.randn(3000) for _ in range(3)]
    ts = [pool.allocate_tensor(3000, (), torch.float32) for _ in range(3)]
    for t, x in zip(ts, xs, strict=True):
        t.write(x)
    handles = [eng.start_offload([t]) for t in ts]  # all three in flight at once
    release.set()
    for h in handles:
        eng.finish_offload(h)
    assert len({id(m) for m in seen}) == 3
    for h in [eng.start_restore([t]) for t in ts]:
        eng.finish_restore(h)
    for t, x in zip(ts, xs, strict=True):
        assert torch.equal(t.read(), x)
    eng.close()


@pytest.mark.parametrize("trim", [True, False])
def test_trimmed_roundtrip_is_exact_and_skips_unused_bytes(trim):
    page = 1 << 15
    pool = PagePool(num_pages=8, page_bytes=page)
    host = HostPool(num_pages=8, page_bytes=page)
    eng = OffloadEngine(pool, host, trim_tails=trim, trim_granule=MIN_GRANULE)
    t = pool.allocate_tensor(page // 4 + 10, (), torch.float32)  # 2 pages, 40 B in the 2nd
    x = torch.randn(page // 4 + 10)
    t.write(x)
    pool.arena[t.pages[1], 40:] = 7  # bytes past the data
    host.arena.zero_()
    eng.offload([t])
    tail = host.arena[t.host_pages[1]]
    copied_past_class = bool((tail[MIN_GRANULE:] == 7).all())
    untouched_past_class = bool((tail[MIN_GRANULE:] == 0).all())
    assert (copied_past_class, untouched_past_class) == (not trim, trim)
    assert torch.equal(t.read(), x)
    assert eng.restore([t]) and torch.equal(t.read(), x)



@pytest.mark.parametrize("mode", MODES)
def test_failed_copy_leaves_tensor_where_it_was(mode, monkeypatch):
    import ditmem.memory.offload as offload

    pool, host, eng = setup(mode)
    t = pool.allocate_tensor(50, (), torch.float32)
    x = torch.randn(50)
    t.write(x)

    def broken(src, dst, mapping):
        raise RuntimeError("DMA error")

    monkeypatch.setattr(offload, "copy_blocks", broken)
    with pytest.raises(RuntimeError, match="DMA error"):
        eng.finish_offload(eng.start_offload([t]))  # sync raises in start, thread in finish
    assert t.state is TensorState.ON_DEVICE and torch.equal(t.read(), x)
    assert host.num_free_pages == 64 and eng.num_in_flight == 0
    monkeypatch.undo()
    eng.offload([t])
    monkeypatch.setattr(offload, "copy_blocks", broken)
    free = pool.num_free_pages
    with pytest.raises(RuntimeError, match="DMA error"):
        eng.finish_restore(eng.start_restore([t]))
    assert t.state is TensorState.ON_HOST and pool.num_free_pages == free
    monkeypatch.undo()
    assert eng.restore([t]) and torch.equal(t.read(), x)
    eng.close()
