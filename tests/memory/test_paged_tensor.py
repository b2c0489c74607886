"""PagePool / PagedTensor: layout, read/write against a plain tensor, errors."""

import pytest
import torch

from ditmem.memory import (
    DoubleFreeError,
    PagePool,
    TensorFreedError,
    TensorState,
    pages_for,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool,
          torch.complex64]


def random_like(shape, dtype, gen=None):
    if dtype is torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=gen)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(0, 100, shape, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("row_shape", [(), (3,), (4, 5)])
def test_write_read_roundtrip(dtype, row_shape):
    pool = PagePool(num_pages=64, page_bytes=256)
    rows = 57
    x = random_like((rows, *row_shape), dtype)
    t = pool.allocate_tensor(rows, row_shape, dtype)
    assert t.num_pages == pages_for(rows, row_shape, dtype, 256)
    t.write(x)
    assert torch.equal(t.read(), x)
    # the kernel view indexed by the page table holds the same rows, zero-copy
    kv = t.kernel_view()
    assert kv.shape == (64, t.rows_per_page, *row_shape)
    assert kv.untyped_storage().data_ptr() == pool.arena.untyped_storage().data_ptr()
    gathered = kv[t.page_table.long()].reshape(-1, *row_shape)[:rows]
    assert torch.equal(gathered, x)


@pytest.mark.parametrize("offset,n", [(0, 1), (3, 10), (7, 30), (56, 1), (16, 32), (0, 57)])
def test_partial_write_and_range_read(offset, n):
    pool = PagePool(num_pages=16, page_bytes=64)  # 4 float32 rows of (4,) ... 4 per page
    t = pool.allocate_tensor(57, (4,), torch.float32)
    assert t.rows_per_page == 4
    ref = torch.randn(57, 4)
    t.write(ref)
    y = torch.randn(n, 4)
    t.write(y, offset=offset)
    ref[offset : offset + n] = y
    assert torch.equal(t.read(), ref)
    for a, b in [(0, 57), (offset, offset + n), (5, 6), (4, 8), (9, 9)]:
        assert torch.equal(t.read(a, b), ref[a:b])


def test_pages_are_disjoint_and_shuffled_free_list():
    pool = PagePool(num_pages=64, page_bytes=128)
    a = pool.allocate_tensor(100, (), torch.float32)  # 32 per page -> 4 pages
    b = pool.allocate_tensor(100, (), torch.float32)
    assert not set(a.pages) & set(b.pages)
    xa, xb = torch.randn(100), torch.randn(100)
    a.write(xa)
    b.write(xb)
    a.free()
    c = pool.allocate_tensor(200, (), torch.float32)
    c.write(torch.zeros(200))
    assert torch.equal(b.read(), xb)
    assert pool.num_free_pages == 64 - b.num_pages - c.num_pages


def test_pool_returns_none_when_full_and_never_evicts():
    pool = PagePool(num_pages=4, page_bytes=64)
    t = pool.allocate_tensor(4 * 16, (), torch.float32)
    assert t is not None and pool.num_free_pages == 0
    assert pool.allocate_tensor(1, (), torch.float32) is None
    assert pool.allocate(1) is None
    assert not pool.can_allocate(1)
    assert t.state is TensorState.ON_DEVICE
    t.free()
    assert pool.can_allocate(4)


def test_errors_are_clear_and_change_nothing():
    pool = PagePool(num_pages=8, page_bytes=64)
    with pytest.raises(ValueError, match="row_shape"):
        pool.allocate_tensor(1, (17,), torch.float32)  # 68 bytes > 64
    t = pool.allocate_tensor(10, (2,), torch.float32)
    x = torch.randn(10, 2)
    t.write(x)
    with pytest.raises(ValueError, match="dtype"):
        t.write(torch.randn(10, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="shape"):
        t.write(torch.randn(10, 3))
    with pytest.raises(ValueError, match="offset"):
        t.write(torch.randn(3, 2), offset=8)
    with pytest.raises(ValueError, match="start/stop"):
        t.read(3, 11)
    assert torch.equal(t.read(), x)
    free_before = pool.num_free_pages
    t.free()
    assert pool.num_free_pages == free_before + t.num_pages
    with pytest.raises(DoubleFreeError):
        t.free()
    for use in (t.read, lambda: t.write(x), t.kernel_view, lambda: t.page_table):
        with pytest.raises(TensorFreedError):
            use()
    assert pool.num_free_pages == 8


def test_page_refcounts_and_double_free_is_atomic():
    pool = PagePool(num_pages=8, page_bytes=64)
    pages = pool.allocate(3)
    pool.retain(pages[:1])
    assert pool.refcount(pages[0]) == 2
    pool.free(pages)
    assert pool.num_free_pages == 7  # pages[0] still held once
    with pytest.raises(DoubleFreeError):
        pool.free([pages[0], pages[1]])  # pages[1] already free: nothing changes
    assert pool.refcount(pages[0]) == 1 and pool.num_free_pages == 7
    pool.free([pages[0]])
    assert pool.num_free_pages == 8
    with pytest.raises(ValueError, match="pages"):
        pool.free([8])


def test_watermark_and_stats():
    pool = PagePool(num_pages=100, page_bytes=64, watermark=0.1)
    assert pool.watermark_pages == 10
    assert pool.can_allocate(95) and not pool.can_allocate(95, keep_watermark=True)
    pages = pool.allocate(85)
    s = pool.stats()
    assert (s.num_pages, s.num_free_pages, s.headroom_pages) == (100, 15, 5)
    pool.free(pages)


def test_pages_for_is_pure_and_accepts_names():
    assert pages_for(1000, (8, 16), "bfloat16", 1 << 16) == 4  # 256 rows of 256 B per page
    assert pages_for(0, (), 4, 64) == 0
    assert pages_for(17, (), "torch.float32", 64) == 2
    with pytest.raises(ValueError, match="dtype"):
        pages_for(1, (), "float13", 64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("offset", [0, 5, 4096])
def test_multi_page_writes_with_big_pages(dtype, offset):
    pool = PagePool(num_pages=16, page_bytes=8192)
    rows = 6 * 8192 // dtype.itemsize + 77  # several full pages and a partial one
    t = pool.allocate_tensor(rows, (), dtype)
    ref = torch.randn(rows).to(dtype)
    t.write(ref)
    y = torch.randn(rows - offset - 3).to(dtype)
    t.write(y, offset=offset)
    ref[offset : offset + y.shape[0]] = y
    assert torch.equal(t.read(), ref)
    assert torch.equal(t.read(offset, rows - 1), ref[offset : rows - 1])
