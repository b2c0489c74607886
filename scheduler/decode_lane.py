"""A decode lane that shares the device with the step loop (processor sharing).

With ``decode="concurrent"`` the engine hands a request whose last step is done to a decode
worker and goes on stepping others; the worker and the step loop then share one device.
While both have work the worker gets ``share`` of the device (0.5: plain time slicing;
lower when the worker runs at a lower OS priority) and the step loop the rest; alone,
either runs at full speed. The worker decodes the earliest deadline first.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

#: How the VAE decode after the last step runs: whole on the step loop, beside it on a
#: worker, or on the step loop one spatial tile at a time between steps.
DECODE_MODES = ("inline", "concurrent", "tiled")


def tile_sizes(size: int, tile: int, stride: int) -> list[int]:
    """Pixel extents of the tiles along one side of ``size`` pixels: tiles of ``tile``
    start every ``stride`` and are cut at the edge (the diffusers VAE's tiled decode)."""
    if tile < 1 or not 0 < stride <= tile:
        raise ValueError(f"tile and stride must satisfy 0 < stride <= tile, got {tile}, {stride}")
    return [min(tile, size - start) for start in range(0, size, stride)]


@dataclass(order=True, slots=True)
class _Decode:
    deadline: float
    seq: int
    rid: str = field(compare=False)
    remaining: float = field(compare=False)


class DecodeLane:
    """Pending decodes (earliest deadline first) and their remaining device seconds."""

    def __init__(self, share: float = 0.5) -> None:
        if not 0.0 < share < 1.0:
            raise ValueError(f"share must be in (0, 1), got {share}")
        self.share_of_device = share
        self._heap: list[_Decode] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, rid: str, deadline: float, seconds: float) -> None:
        """Queue the decode of ``rid`` (``seconds`` of work alone on the device)."""
        heapq.heappush(self._heap, _Decode(deadline, self._seq, rid, max(0.0, seconds)))
        self._seq += 1

    def share(self, now: float, work: float) -> tuple[float, list[tuple[str, float]]]:
        """Run ``work`` seconds of step-loop work from ``now`` beside the pending decodes.

        Returns (when the work is done, [(request id, decode finish time), ...]).
        """
        done: list[tuple[str, float]] = []
        a = self.share_of_device
        while work > 1e-12:
            if not self._heap:
                return now + work, done
            head = self._heap[0]
            dt = min(head.remaining / a, work / (1.0 - a))
            now += dt
            work -= dt * (1.0 - a)
            head.remaining -= dt * a
            if head.remaining <= 1e-12:
                heapq.heappop(self._heap)
                done.append((head.rid, now))
        return now, done

    def run_until(self, now: float, until: float | None) -> tuple[float, list[tuple[str, float]]]:
        """Decode alone at full speed from ``now`` until ``until`` or the next decode ends,
        whichever is first (``until`` None: until the next decode ends).

        Returns (the time reached, [(request id, decode finish time)] with at most one entry).
        """
        if not self._heap:
            return (now if until is None else max(now, until)), []
        head = self._heap[0]
        dt = head.remaining if until is None else max(0.0, min(head.remaining, until - now))
        now += dt
        head.remaining -= dt
        if head.remaining <= 1e-12:
            heapq.heappop(self._heap)
            return now, [(head.rid, now)]
        return now, []


#: ``TiledDecodes``' default share of the loop for a late decode (its docstring)
LATE_SHARE = 0.1


@dataclass(order=True, slots=True)
class _Tiled:
    deadline: float
    seq: int
    rid: str = field(compare=False)
    units: list[float] = field(compare=False)
    tiles: int = field(compare=False, default=0)
    first: bool = field(compare=False, default=False)


def step_deadline(now: float, deadlines: list[float]) -> float | None:
    """The deadline a planned step holds decode tiles to (:meth:`TiledDecodes.pick`), from
    its members' ``deadlines`` (s, engine clock): the earliest still ahead of ``now``;
    ``inf`` when every one has passed (the step is late whatever runs first); None when no
    step is planned (no members)."""
    if not deadlines:
        return None
    return min((d for d in deadlines if d > now), default=float("inf"))


class TiledDecodes:
    """Decodes split into tiles that run on the step loop one at a time (seconds per tile).

    :meth:`pick` chooses which decode (if any) runs a tile instead of the planned step
    (the caller does not ask when the plan holds tiles, ``StepPlan.hold_tiles``): first a
    decode pushed with ``first`` (the earliest-deadline one; ``StepPlan.first_decodes``),
    unless an on-time decode that would miss behind its remaining tiles has a next tile
    within ``yield_s``, which then goes; with no step planned, the earliest-deadline decode
    that can still meet its deadline (else the earliest deadline: all are late);
    otherwise the earliest-deadline decode that can still meet its deadline, if it is due
    before the step's deadline (a decode
    that will miss anyway does not hold back requests that can still make it; the step's
    deadline is :func:`step_deadline`'s, so a step whose members are all past due does not
    hold back a decode that can still make it either);
    otherwise, while some decode will miss its deadline, the earliest-deadline such *late*
    decode runs its next tile once a credit covers it: the credit grows by
    ``elapsed · late_share / (1 − late_share)`` between picks while a late decode is
    pending (capped at that next tile) and is spent when the tile runs. Its first tile thus
    runs once the other work has left it ``late_share`` of the loop; the credit also grows
    while the late tiles themselves run, so under steady load late tiles take up to
    ``late_share / (1 − late_share)`` of the loop (0.11 at the default 0.1), not exactly
    ``late_share``. Besides, the policy may grant late decodes ``spare`` seconds with its
    plan (``StepPlan.late_tiles_s``: time no on-time request needs); the earliest-deadline
    late decode's next tile then runs when it fits in them, credit or not.

    **The bound** (``late_share`` = s > 0). While the earliest-deadline late decode has a
    tile of ``u`` s left, the loop runs at most ``u · (1 − s) / s`` s of other work plus the
    rest of one step (a step is never split) before that tile runs. So a late decode of
    ``n`` tiles and ``S`` s in all that stays the earliest-deadline late one finishes within
    ``S / s + n · T`` of the time it became so (``T``: the longest step or on-time tile) —
    it can no longer wait for an idle device without bound. With ``late_share`` 0 a late
    decode runs only when no step is planned (the rule before; no bound under load).
    """

    def __init__(self, late_share: float = LATE_SHARE) -> None:
        if not 0.0 <= late_share < 1.0:
            raise ValueError(f"late_share must be in [0, 1), got {late_share!r}")
        self.late_share = late_share
        self._pending: list[_Tiled] = []
        self._seq = 0
        self._credit = 0.0  # loop seconds the late decodes have earned (s)
        self._last: float | None = None  # the previous pick's time, if a late decode was pending

    def __len__(self) -> int:
        return len(self._pending)

    def push(self, rid: str, deadline: float, tile_seconds: list[float],
             first: bool = False) -> None:
        """Queue the decode of ``rid`` as tiles of ``tile_seconds`` each (at least one);
        ``first``: it goes before any step (:meth:`pick`)."""
        units = list(tile_seconds) or [0.0]
        self._pending.append(_Tiled(deadline, self._seq, rid, units[::-1], len(units), first))
        self._pending.sort()
        self._seq += 1

    def pick(self, now: float, deadline: float | None, spare: float = 0.0,
             yield_s: float = 0.0) -> str | None:
        """The decode to advance now instead of a step due at ``deadline`` (None: no step
        planned), or None to run the step (class docstring: the rule and its bound);
        ``spare`` (s): time the policy grants late decodes before the step
        (``StepPlan.late_tiles_s``): the late decode's next tile runs when it fits in it;
        ``yield_s`` (s): what a first-going decode may yield (``StepPlan.yield_s``)."""
        first = next((d for d in self._pending if d.first), None)
        if first is not None:
            ahead = sum(first.units)
            urgent = next((d for d in self._pending if not d.first
                           and now + sum(d.units) <= d.deadline
                           < now + ahead + sum(d.units)), None)
            if urgent is not None and urgent.units[-1] <= yield_s + 1e-9:
                return urgent.rid
            return first.rid
        late = next((d for d in self._pending if now + sum(d.units) > d.deadline), None)
        if late is None or self.late_share <= 0:
            self._credit, self._last = 0.0, None
        else:
            if self._last is not None:
                rate = self.late_share / (1.0 - self.late_share)
                self._credit += max(0.0, now - self._last) * rate
            self._credit = min(self._credit, late.units[-1])
            self._last = now
        if not self._pending:
            return None
        if deadline is None:
            due = next((d for d in self._pending if now + sum(d.units) <= d.deadline), None)
            return (due or self._pending[0]).rid
        for d in self._pending:
            if d.deadline >= deadline:
                break
            if now + sum(d.units) <= d.deadline:
                return d.rid
        if late is not None and self.late_share > 0 and self._credit >= late.units[-1] - 1e-9:
            self._credit = 0.0
            return late.rid
        if late is not None and spare > 0:
            # a policy need not count pending decodes (slo does only with see_decodes): those
            # that can still make it keep their time out of the grant
            owed = sum(sum(d.units) for d in self._pending if now + sum(d.units) <= d.deadline)
            if spare - owed >= late.units[-1] - 1e-9:
                return late.rid
        return None

    def pending(self) -> list[tuple[str, int, int]]:
        """``(request id, tiles left, tiles)`` per pending decode, earliest deadline first."""
        return [(d.rid, len(d.units), d.tiles) for d in self._pending]

    def goes_first(self, rid: str) -> bool:
        """Was the pending decode of ``rid`` pushed with ``first``? (False: unknown id.)"""
        return any(d.first for d in self._pending if d.rid == rid)

    def remove(self, rid: str) -> None:
        """Forget the decode of ``rid`` (cancelled or failed); unknown ids are ignored."""
        self._pending = [d for d in self._pending if d.rid != rid]

    def run_one(self, rid: str) -> tuple[float, bool]:
        """Run the next tile of ``rid``'s decode: (its seconds, whether that was the last)."""
        i = next(i for i, d in enumerate(self._pending) if d.rid == rid)
        d = self._pending[i]
        seconds = d.units.pop()
        if d.units:
            return seconds, False
        del self._pending[i]
        return seconds, True
