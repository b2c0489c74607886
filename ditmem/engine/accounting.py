"""The cost model the engine hands its policy: the profile's predictions, but each submitted
request's page count is the generator's exact one (the profile only estimates memory).

Without this, a policy that under-estimates a request's pages would plan an admit the pool
cannot take, and ask for it again every iteration.
"""

from __future__ import annotations

from ditmem.scheduler import CostModel


class ExactPagesCost:
    """Wraps a ``CostModel``; ``pages_for`` answers from ``exact`` when the engine knows the
    request (``register``/``forget`` by id), everything else is delegated unchanged."""

    def __init__(self, base: CostModel):
        self.base = base
        self.exact: dict[str, tuple[int, int]] = {}  # id -> (page_bytes, pages)

    def register(self, request_id: str, page_bytes: int, pages: int) -> None:
        self.exact[request_id] = (page_bytes, pages)

    def forget(self, request_id: str) -> None:
        self.exact.pop(request_id, None)

    def pages_for(self, request, page_bytes: int | None = None) -> int:
        known = self.exact.get(request.id)
        if known is not None and (page_bytes is None or known[0] == page_bytes):
            return known[1]
        if page_bytes is None:
            return self.base.pages_for(request)
        return self.base.pages_for(request, page_bytes)

    def __getattr__(self, name):
        return getattr(self.base, name)
