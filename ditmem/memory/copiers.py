"""How an ``OffloadEngine`` runs a page copy: inline, on a worker thread, or on a side stream.

A copier's ``start(fn)`` launches ``fn`` (which enqueues/performs the copy) and returns a
token; ``ready`` polls it; ``wait_host`` blocks the calling thread until the copy is done
(and re-raises its error); ``wait_device`` orders later work on the device's current stream
after the copy without blocking the host when the backend allows it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch


class SyncCopier:
    """Runs the copy inside ``start``: simplest, no overlap (CPU default)."""

    name = "sync"

    def start(self, fn: Callable[[], None]) -> None:
        fn()

    def ready(self, token) -> bool:
        return True

    def wait_host(self, token) -> None:
        pass

    def wait_device(self, token) -> None:
        pass

    def close(self) -> None:
        pass


class ThreadCopier:
    """Runs copies one after another on a worker thread (torch releases the GIL in copies)."""

    name = "thread"

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ditmem-offload")

    def start(self, fn: Callable[[], None]) -> Future:
        return self._pool.submit(fn)

    def ready(self, token: Future) -> bool:
        return token.done()

    def wait_host(self, token: Future) -> None:
        token.result()

    def wait_device(self, token: Future) -> None:
        token.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class StreamCopier:
    """Copies on a side stream of a CUDA/NPU device, ordered with the compute stream by events.

    ``start`` makes the side stream wait for everything already queued on the current stream
    (the pages being offloaded were written there; the pages being restored into may still
    be read there), enqueues the copy on the side stream and records a completion event.
    """

    name = "stream"

    def __init__(self, device: torch.device) -> None:
        if device.type not in ("cuda", "npu"):
            raise ValueError(f"device: StreamCopier needs a cuda or npu device, got {device}")
        self.device = device
        self._mod = torch.get_device_module(device.type)
        self.stream = self._mod.Stream(device=device)

    def start(self, fn: Callable[[], None]):
        current = self._mod.current_stream(self.device)
        self.stream.wait_stream(current)
        with self._mod.stream(self.stream):
            fn()
            done = self._mod.Event()
            done.record(self.stream)
        return done

    def ready(self, token) -> bool:
        return token.query()

    def wait_host(self, token) -> None:
        token.synchronize()

    def wait_device(self, token) -> None:
        self._mod.current_stream(self.device).wait_event(token)

    def close(self) -> None:
        self.stream.synchronize()


def make_copier(mode: str, device: torch.device):
    """The copier for ``mode`` ("auto", "sync", "thread", "stream") on ``device``."""
    if mode == "auto":
        mode = "stream" if device.type in ("cuda", "npu") else "sync"
    if mode == "sync":
        return SyncCopier()
    if mode == "thread":
        return ThreadCopier()
    if mode == "stream":
        return StreamCopier(device)
    raise ValueError(f"mode: expected 'auto', 'sync', 'thread' or 'stream', got {mode!r}")
