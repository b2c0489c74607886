"""The fewest misses on a node of D devices under flow limits, as an exact program over a
relaxed node (``scheduler.exact_bound`` with the node's works).

**The relaxation.** The node is pooled into one machine D times as fast, as in
``node.bound``: any schedule does at most D (t − r) device-seconds inside [r, t]. A request
whose flow is at most F spends at least ``least_device_seconds(F)`` device-seconds (its
steps' charges at the degrees and batches whose durations fit F, its encode, its decode
tiles and blend; inf where even its fastest run is longer than F). Every option
(tier × on time or late, ``exact_bound``) is charged that work at its own flow cap, ÷ D.
Horn's interval condition on those works is then necessary for every node schedule, so
the program's optimum is a lower bound on the misses of every schedule on the node —
packed, at any degrees, split decodes included. It is not exact for the node (the pooled
machine splits work across devices at no loss).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..exact_bound import ExactBound, PercentileBound, min_misses_with, percentile_search
from ..request import Request
from .bound import StepFloors, least_device_seconds
from .cost import NodeCost


def min_node_misses_exact(
    requests: Sequence[Request],
    ncost: NodeCost,
    devices: int,
    degrees: Sequence[int],
    *,
    limits: Sequence[tuple[float, int]] = (),
    time_limit_s: float = 120.0,
) -> ExactBound:
    """A lower bound on the misses of every schedule of ``requests`` (deadlines set) on
    ``devices`` devices running ``degrees``, with at most e flows above T s for each
    (T, e) of ``limits`` (module docstring). ``exact_bound.Infeasible`` when no schedule
    keeps them."""
    floors = _floors(requests, ncost, devices, degrees)
    return _solve(requests, floors, devices, limits, time_limit_s)


def node_misses_percentile(
    requests: Sequence[Request],
    ncost: NodeCost,
    devices: int,
    degrees: Sequence[int],
    *,
    q: float,
    value: float,
    limits: Sequence[tuple[float, int]] = (),
    cells: int = 8,
    time_limit_s: float = 120.0,
) -> PercentileBound:
    """A lower bound (``lower``) on the misses of every node schedule whose ``q``-th
    latency percentile is ≤ ``value`` s and which keeps ``limits`` too
    (``exact_bound.percentile_search``'s cells over ``min_node_misses_exact``)."""
    floors = _floors(requests, ncost, devices, degrees)

    def solve(cell_limits) -> ExactBound:
        return _solve(requests, floors, devices, [*cell_limits, *limits], time_limit_s)

    return percentile_search(len(requests), q, value, solve, cells=cells)


def _floors(requests, ncost: NodeCost, devices: int, degrees: Sequence[int]) -> StepFloors:
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices!r}")
    if not degrees or max(degrees) > devices:
        raise ValueError(f"degrees must be non-empty and <= devices, got {tuple(degrees)!r}")
    return StepFloors(requests, ncost, degrees)


def _solve(requests, floors: StepFloors, devices: int, limits, time_limit_s: float
           ) -> ExactBound:
    def work_of(j: int, tier: int, late: bool, cap: float) -> float:
        return least_device_seconds(requests[j], floors, cap) / devices

    return min_misses_with(requests, work_of, limits=limits, time_limit_s=time_limit_s)


__all__ = ["min_node_misses_exact", "node_misses_percentile"]
