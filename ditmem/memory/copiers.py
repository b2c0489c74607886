"""How an ``OffloadEngine`` runs a page copy: inline, on a worker thread, or on a side stream.

A copier's ``start(fn)`` launches ``fn`` (which enqueues/performs the copy) and returns a
token; ``ready`` polls it; ``wait_host`` blocks the calling thread until the copy is done
(and re-raises its error); ``wait_device`` orders later work on the device's current stream
after the copy without blocking the host when the backend allows it; ``elapsed`` is the
copy's own duration in seconds (device events on a stream, the wall clock otherwise), valid
once the copy is done, so a transfer is charged its own time and not the next step's.

On CUDA/NPU the ``sync`` and ``thread`` copiers synchronise the stream the copy was issued
on before they report it done: ``copy_blocks`` issues host<->device copies non-blocking from
pinned memory, and host pages must not be read (or reused) before the DMA has finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

_ACCELERATORS = ("cuda", "npu")


def _stream_sync(device: torch.device | None) -> Callable[[], None]:
    """A function waiting for the current stream of ``device`` (a no-op on the CPU)."""
    if device is None or device.type not in _ACCELERATORS:
        return lambda: None
    mod = torch.get_device_module(device.type)
    return lambda: mod.current_stream(device).synchronize()


class _Done:
    """Token of a finished inline copy: its duration."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class SyncCopier:
    """Runs the copy inside ``start`` (and waits for it on an accelerator): no overlap."""

    name = "sync"

    def __init__(self, device: torch.device | None = None) -> None:
        self._sync = _stream_sync(device)

    def start(self, fn: Callable[[], None]) -> _Done:
        t0 = time.perf_counter()
        fn()
        self._sync()
        return _Done(time.perf_counter() - t0)

    def ready(self, token) -> bool:
        return True

    def wait_host(self, token) -> None:
        pass

    def wait_device(self, token) -> None:
        pass

    def elapsed(self, token) -> float:
        return token.seconds

    def close(self) -> None:
        pass


class ThreadCopier:
    """Runs copies one after another on a worker thread (torch releases the GIL in copies);
    on an accelerator the worker waits for its stream before the copy counts as done."""

    name = "thread"

    def __init__(self, device: torch.device | None = None) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ditmem-offload")
        self._sync = _stream_sync(device)

    def start(self, fn: Callable[[], None]) -> Future:
        def run() -> float:
            t0 = time.perf_counter()
            fn()
            self._sync()
            return time.perf_counter() - t0

        return self._pool.submit(run)

    def ready(self, token: Future) -> bool:
        return token.done()

    def wait_host(self, token: Future) -> None:
        token.result()

    def wait_device(self, token: Future) -> None:
        token.result()

    def elapsed(self, token: Future) -> float:
        return token.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class StreamCopier:
    """Copies on a side stream of a CUDA/NPU device, ordered with the compute stream by events.

    ``start`` makes the side stream wait for everything already queued on the current stream
    (the pages being offloaded were written there; the pages being restored into may still
    be read there), enqueues the copy on the side stream between two timing events.
    """

    name = "stream"

    def __init__(self, device: torch.device) -> None:
        if device.type not in _ACCELERATORS:
            raise ValueError(f"device: StreamCopier needs a cuda or npu device, got {device}")
        self.device = device
        self._mod = torch.get_device_module(device.type)
        self.stream = self._mod.Stream(device=device)

    def start(self, fn: Callable[[], None]):
        current = self._mod.current_stream(self.device)
        self.stream.wait_stream(current)
        with self._mod.stream(self.stream):
            begin = self._mod.Event(enable_timing=True)
            begin.record(self.stream)
            fn()
            done = self._mod.Event(enable_timing=True)
            done.record(self.stream)
        return begin, done

    def ready(self, token) -> bool:
        return token[1].query()

    def wait_host(self, token) -> None:
        token[1].synchronize()

    def wait_device(self, token) -> None:
        self._mod.current_stream(self.device).wait_event(token[1])

    def elapsed(self, token) -> float:
        token[1].synchronize()
        return token[0].elapsed_time(token[1]) / 1000.0

    def close(self) -> None:
        self.stream.synchronize()


def make_copier(mode: str, device: torch.device):
    """The copier for ``mode`` ("auto", "sync", "thread", "stream") on ``device``."""
    if mode == "auto":
        mode = "stream" if device.type in _ACCELERATORS else "sync"
    if mode == "sync":
        return SyncCopier(device)
    if mode == "thread":
        return ThreadCopier(device)
    if mode == "stream":
        return StreamCopier(device)
    raise ValueError(f"mode: expected 'auto', 'sync', 'thread' or 'stream', got {mode!r}")
