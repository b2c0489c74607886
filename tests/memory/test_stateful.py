"""Hypothesis state machine over PagePool + HostPool + OffloadEngine.

Random allocate / write / free / offload / restore / finish / cancel / shuffle sequences,
checked after every step against a shadow copy of each tensor and an independent count of
who owns which page.
"""

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ditmem.memory import (
    HostPool,
    HostPoolExhausted,
    OffloadEngine,
    PagePool,
    TensorState,
    TensorStateError,
    pages_for,
)

PAGE_BYTES = 128
DEVICE_PAGES, HOST_PAGES = 24, 32
LAYOUTS = [((), torch.float32), ((3,), torch.bfloat16), ((2, 5), torch.int16),
           ((7,), torch.uint8), ((4,), torch.float64)]


def fill(rows, row_shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-1000, 1000, (rows, *row_shape), generator=g)
    if dtype.is_floating_point:
        return (x.to(torch.float64) / 7).to(dtype)
    return x.to(dtype) if dtype is not torch.uint8 else (x % 256).to(dtype)


class PoolMachine(RuleBasedStateMachine):
    mode = "sync"
    page_bytes = PAGE_BYTES
    layouts = LAYOUTS

    def __init__(self):
        super().__init__()
        self.pool = PagePool(DEVICE_PAGES, self.page_bytes)
        self.host = HostPool(HOST_PAGES, self.page_bytes)
        self.eng = OffloadEngine(self.pool, self.host, mode=self.mode, trim_granule=4096)
        self.live = []      # [PagedTensor, shadow]
        self.handles = []   # in-flight TransferHandles
        self.fillers = []   # raw page lists held outside any tensor

    # ------------------------------------------------------------ helpers
    def _with_state(self, state):
        return [e for e in self.live if e[0].state is state]

    # ------------------------------------------------------------ rules
    @rule(data=st.data(), rows=st.integers(0, 60), seed=st.integers(0, 2**16))
    def allocate(self, data, rows, seed):
        row_shape, dtype = data.draw(st.sampled_from(self.layouts))
        need = pages_for(rows, row_shape, dtype, self.page_bytes)
        free = self.pool.num_free_pages
        t = self.pool.allocate_tensor(rows, row_shape, dtype)
        if need > free:
            assert t is None and self.pool.num_free_pages == free
            return
        assert t is not None and len(t.pages) == need
        x = fill(rows, row_shape, dtype, seed)
        t.write(x)
        self.live.append([t, x])

    @precondition(lambda self: self._with_state(TensorState.ON_DEVICE))
    @rule(data=st.data())
    def write(self, data):
        entry = data.draw(st.sampled_from(self._with_state(TensorState.ON_DEVICE)))
        t, shadow = entry
        offset = data.draw(st.integers(0, t.rows))
        n = data.draw(st.integers(0, t.rows - offset))
        y = fill(n, t.row_shape, t.dtype, data.draw(st.integers(0, 2**16)))
        t.write(y, offset=offset)
        shadow[offset : offset + n] = y

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        entry = data.draw(st.sampled_from(self.live))
        t = entry[0]
        if t.state in (TensorState.OFFLOADING, TensorState.RESTORING):
            with pytest.raises(TensorStateError):
                t.free()
            return
        t.free()
        self.live.remove(entry)

    @precondition(lambda self: self._with_state(TensorState.ON_DEVICE))
    @rule(data=st.data())
    def start_offload(self, data):
        group = data.draw(st.lists(st.sampled_from(self._with_state(TensorState.ON_DEVICE)),
                                   min_size=1, max_size=3, unique_by=id))
        tensors = [e[0] for e in group]
        need = sum(t.num_pages for t in tensors)
        if need > self.host.num_free_pages:
            with pytest.raises(HostPoolExhausted):
                self.eng.start_offload(tensors)
            assert all(t.state is TensorState.ON_DEVICE for t in tensors)
            return
        self.handles.append(self.eng.start_offload(tensors))

    @precondition(lambda self: self._with_state(TensorState.ON_HOST))
    @rule(data=st.data())
    def start_restore(self, data):
        group = data.draw(st.lists(st.sampled_from(self._with_state(TensorState.ON_HOST)),
                                   min_size=1, max_size=3, unique_by=id))
        tensors = [e[0] for e in group]
        need = sum(t.num_pages for t in tensors)
        fits = need <= self.pool.num_free_pages
        h = self.eng.start_restore(tensors)
        assert (h is not None) == fits
        if h is None:
            assert all(t.state is TensorState.ON_HOST for t in tensors)
        else:
            self.handles.append(h)

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), cancel=st.booleans())
    def finish_or_cancel(self, data, cancel):
        h = data.draw(st.sampled_from(self.handles))
        self.handles.remove(h)
        before = [t.state for t in h.tensors]
        if cancel:
            self.eng.cancel(h)
            assert [t.state for t in h.tensors] == [
                TensorState.ON_DEVICE if s is TensorState.OFFLOADING else TensorState.ON_HOST
                for s in before]
        else:
            self.eng.finish(h)
            want = TensorState.ON_HOST if h.kind == "offload" else TensorState.ON_DEVICE
            assert all(t.state is want for t in h.tensors)

    @rule(n=st.integers(1, 6))
    def take_filler(self, n):
        fits = n <= self.pool.num_free_pages
        pages = self.pool.allocate(n)
        assert (pages is not None) == fits
        if pages is not None:
            self.fillers.append(pages)

    @precondition(lambda self: self.fillers)
    @rule(data=st.data())
    def drop_filler(self, data):
        pages = data.draw(st.sampled_from(self.fillers))
        self.fillers.remove(pages)
        self.pool.free(pages)

    # ------------------------------------------------------------ invariants
    @invariant()
    def no_page_owned_twice_and_counts_match(self):
        dev, hst = [], []
        for f in self.fillers:
            dev += f
        in_flight = {id(t): h for h in self.handles for t in h.tensors}
        for t, _ in self.live:
            h = in_flight.get(id(t))
            if t.state is TensorState.ON_DEVICE:
                dev += t.pages
            elif t.state is TensorState.ON_HOST:
                hst += t.host_pages
            else:
                i = h.tensors.index(t)
                src, dst = h.src_pages[i], h.dst_pages[i]
                if h.kind == "offload":
                    dev, hst = dev + src, hst + dst
                else:
                    dev, hst = dev + dst, hst + src
        assert len(dev) == len(set(dev)) and len(hst) == len(set(hst))
        assert len(dev) == DEVICE_PAGES - self.pool.num_free_pages
        assert len(hst) == HOST_PAGES - self.host.num_free_pages
        assert all(self.pool.refcount(p) == 1 for p in dev)

    @invariant()
    def data_matches_shadow(self):
        for t, shadow in self.live:
            if t.state in (TensorState.ON_DEVICE, TensorState.ON_HOST):
                assert torch.equal(t.read(), shadow)

    def teardown(self):
        for h in list(self.handles):
            self.eng.finish(h)
        for t, shadow in self.live:
            assert torch.equal(t.read(), shadow)
            t.free()
        for f in self.fillers:
            self.pool.free(f)
        assert self.pool.num_free_pages == DEVICE_PAGES
        assert self.host.num_free_pages == HOST_PAGES
        assert self.eng.num_in_flight == 0
        self.eng.close()


class ThreadedPoolMachine(PoolMachine):
    mode = "thread"


class TrimmedTailsMachine(PoolMachine):
    """Pages big enough (16 KiB) that partly used last pages are copied trimmed."""

    page_bytes = 16384
    layouts = [((40,), torch.float64), ((9, 13), torch.bfloat16), ((), torch.float32),
               ((1000,), torch.uint8)]


SETTINGS = settings(max_examples=150, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = SETTINGS
TestThreadedPoolMachine = ThreadedPoolMachine.TestCase
TestThreadedPoolMachine.settings = SETTINGS
TestTrimmedTailsMachine = TrimmedTailsMachine.TestCase
TestTrimmedTailsMachine.settings = settings(SETTINGS, max_examples=80)
