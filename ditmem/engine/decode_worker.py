"""Decode worker threads that take the earliest deadline first.

The engine hands a request whose last step is done to these workers and goes on stepping
others (``--decode-workers N``); the simulator models the same with ``decode="concurrent"``.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable


class DecodeWorkers:
    """``n`` threads running submitted decodes, earliest ``deadline`` first."""

    def __init__(self, n: int, name: str = "ditmem-decode"):
        if n < 1:
            raise ValueError(f"decode workers must be >= 1, got {n}")
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self._closed = False
        self._cv = threading.Condition()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(n)]
        for t in self._threads:
            t.start()

    def submit(self, deadline: float, fn: Callable[[], None]) -> None:
        """Queue ``fn`` (it must not raise) to run when it is the earliest deadline."""
        with self._cv:
            if self._closed:
                raise RuntimeError("decode workers are shut down")
            heapq.heappush(self._heap, (deadline, self._seq, fn))
            self._seq += 1
            self._cv.notify()

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._heap and not self._closed:
                    self._cv.wait()
                if not self._heap:
                    return
                _, _, fn = heapq.heappop(self._heap)
            fn()

    def shutdown(self, wait: bool = True) -> None:
        """Stop taking work; queued decodes still run. ``wait``: join the threads."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if wait:
            for t in self._threads:
                t.join()
