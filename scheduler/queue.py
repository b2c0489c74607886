"""The waiting queue: arrived, not yet started requests, kept in the orders policies need.

Policies must decide in well under a millisecond with thousands of requests waiting, so
they never scan the queue: they read the first few entries of an order. Each order is a
sorted list of ``(key, seq, id)`` maintained with ``bisect`` (O(log n) search, a C memmove
to insert or remove).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from itertools import islice

from .request import Request

ORDERS = ("arrival", "deadline", "size")


class WaitingQueue:
    """Requests that arrived and have not started, ordered by arrival, deadline and size.

    ``size`` is the standalone estimate (``request.standalone_s``). Ties break by insertion
    order, so iteration is deterministic.
    """

    def __init__(self) -> None:
        self._requests: dict[str, Request] = {}
        self._keys: dict[str, tuple] = {}
        self._orders: dict[str, list[tuple]] = {name: [] for name in ORDERS}
        self._custom: dict[str, Callable[[Request], float]] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._requests

    def get(self, request_id: str) -> Request:
        """The waiting request with this id (``KeyError`` if it is not waiting)."""
        return self._requests[request_id]

    def push(self, request: Request) -> None:
        """Queue a request; it needs ``deadline`` and ``standalone_s`` (see CostModel)."""
        if request.id in self._requests:
            raise ValueError(f"request {request.id!r} is already waiting")
        if request.deadline is None or request.standalone_s is None:
            raise ValueError(
                f"request {request.id!r} has no deadline/standalone estimate: "
                "call CostModel.assign_deadline(request) first"
            )
        seq = self._seq
        self._seq += 1
        keys = {
            "arrival": (request.arrival, seq, request.id),
            "deadline": (request.deadline, seq, request.id),
            "size": (request.standalone_s, seq, request.id),
        }
        for name, fn in self._custom.items():
            keys[name] = (fn(request), seq, request.id)
        self._requests[request.id] = request
        self._keys[request.id] = keys
        for name, key in keys.items():
            bisect.insort(self._orders[name], key)

    def remove(self, request_id: str) -> Request:
        """Take a request out of the queue (it started or was cancelled) and return it."""
        request = self._requests.pop(request_id)
        for name, key in self._keys.pop(request_id).items():
            order = self._orders[name]
            del order[bisect.bisect_left(order, key)]
        return request

    def ensure_order(self, name: str, key: Callable[[Request], float]) -> None:
        """Maintain an extra order by ``key(request)`` (a policy's own priority; the key must
        not change while the request waits). Built once over the queue, then kept on push."""
        if name in self._custom or name in ORDERS:
            if name in ORDERS:
                raise ValueError(f"order {name!r} is built in")
            return
        self._custom[name] = key
        entries = []
        for rid, keys in self._keys.items():
            keys[name] = (key(self._requests[rid]), keys["arrival"][1], rid)
            entries.append(keys[name])
        entries.sort()
        self._orders[name] = entries

    def iter_by(self, order: str, limit: int | None = None) -> Iterator[Request]:
        """Waiting requests in ``order`` ("arrival", "deadline", "size" or one added with
        ``ensure_order``), the first ``limit`` of them."""
        if order not in self._orders:
            raise ValueError(f"order must be one of {tuple(self._orders)}, got {order!r}")
        keys = self._orders[order] if limit is None else islice(self._orders[order], limit)
        for key in keys:
            yield self._requests[key[2]]

    def arrived_after(self, t: float) -> list[Request]:
        """Waiting requests that arrived strictly after ``t``, oldest first."""
        order = self._orders["arrival"]
        start = bisect.bisect_right(order, (t, float("inf"), ""))
        return [self._requests[key[2]] for key in order[start:]]

    def first(self, order: str) -> Request | None:
        """The first waiting request in ``order``, or None when the queue is empty."""
        entries = self._orders.get(order)
        if entries is None:
            raise ValueError(f"order must be one of {tuple(self._orders)}, got {order!r}")
        return self._requests[entries[0][2]] if entries else None
