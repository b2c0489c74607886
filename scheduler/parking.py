"""The simulated engine's parking of part-done steps and its host link (block preemption).

When a batch pauses between blocks, its block-boundary activations are copied out of the
step's workspace into device pages (a device-local copy, not charged) and an offload to the
host starts at once on the host link, **overlapping** whatever computes next; the device
pages free when it completes. If the batch resumes before that, the offload is abandoned
and the activations are read from the device pages (no restore). Otherwise the restore runs
on the link before the resumed chunk can start (**not** overlapped: the chunk needs it).
With no free device pages the offload is synchronous; with no host room the activations stay
in device pages. The link is one resource: offloads, restores and the plans' page moves
queue on it in order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .cost import CostModel
from .request import Location


class ParkError(RuntimeError):
    """A part-done step could not be parked (no device pages and no host room)."""


@dataclass(slots=True)
class Parked:
    """One parked part-done step: its group, size and where its activations are."""

    group: tuple[str, ...]
    nbytes: int
    pages: int
    location: Location
    host_reserved: bool
    offload_done: float


class HostLink:
    """A FIFO timeline of copies over the device–host link."""

    def __init__(self, cost: CostModel, noise=None):
        self.cost = cost
        self.noise = noise
        self.free_at = 0.0
        self.busy_s = 0.0

    def copy(self, now: float, nbytes: float) -> float:
        """Queue a copy of ``nbytes`` at ``now``; return the time it completes (its duration
        drawn by ``noise``, a ``TimingNoise``, around the cost model's when one is given)."""
        seconds = self.cost.transfer_time(nbytes)
        if self.noise is not None:
            seconds = self.noise.draw(seconds, "move")
        start = max(now, self.free_at)
        self.free_at = start + seconds
        self.busy_s += seconds
        return self.free_at


class Parking:
    """Part-done steps parked by group; page counts are charged to the engine's pools."""

    def __init__(self, cost: CostModel, link: HostLink, page_bytes: int):
        self.cost = cost
        self.link = link
        self.page_bytes = page_bytes
        self.parked: dict[tuple[str, ...], Parked] = {}
        self.bytes_offloaded = 0

    def settle(self, now: float, pools) -> None:
        """Finish the offloads complete by ``now``: their device pages become free."""
        for p in self.parked.values():
            if p.location is Location.DEVICE and p.host_reserved and p.offload_done <= now:
                p.location = Location.HOST
                pools.free += p.pages

    def park(self, group: tuple[str, ...], nbytes: int, now: float, pools) -> float:
        """Park a part-done step; return seconds the device must wait (0 when overlapped)."""
        pages = max(1, math.ceil(nbytes / self.page_bytes))
        on_device = pools.free >= pages
        to_host = pools.host_free >= pages
        if not on_device and not to_host:
            raise ParkError(
                f"cannot park step of {list(group)}: {pages} pages needed, "
                f"{pools.free} free on the device and {pools.host_free} on the host"
            )
        wait = 0.0
        done = now
        if to_host:
            pools.host_free -= pages
            done = self.link.copy(now, nbytes)
            self.bytes_offloaded += nbytes
        if on_device:
            pools.free -= pages
            location = Location.DEVICE
        else:
            wait, location = done - now, Location.HOST
        self.parked[group] = Parked(group, nbytes, pages, location, to_host, done)
        return wait

    def resume(self, group: tuple[str, ...], now: float, pools) -> float:
        """Bring a parked step back; return seconds before its next chunk can start."""
        p = self.parked.pop(group)
        if p.host_reserved:
            pools.host_free += p.pages
        if p.location is Location.DEVICE:
            pools.free += p.pages
            return 0.0
        return self.link.copy(now, p.nbytes) - now

    def location(self, group: tuple[str, ...]) -> Location | None:
        p = self.parked.get(group)
        return None if p is None else p.location

    def can_park(self, nbytes: int, free_pages: int, host_free_pages: int) -> bool:
        """Whether a step with ``nbytes`` of activations can be parked with these pools."""
        pages = max(1, math.ceil(nbytes / self.page_bytes))
        return free_pages >= pages or host_free_pages >= pages
