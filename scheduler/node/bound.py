"""The offline bound and the clairvoyant reference on a node of D devices.

**Relaxation (what makes the bound sound).** Any schedule on D devices does at most
D × (t2 − t1) device-seconds of work inside a window [t1, t2], and a request costs at least
its *least device-seconds*: over every degree d and every batch, d × its share of a step at
d is never below its share at degree 1 (speed-up(d) ≤ d, checked on the profile), so the
least is the single-device bound's work (``ditmem.scheduler.bound.min_work``, profile
shares: the per-step floor over a full batch, utilisation with the trace's largest
partners; encode and decode). So the node is relaxed to **one machine D times as fast**
(every request's work divided by D) and the single-device machinery applies unchanged —
Moore–Hodgson per window, disjoint windows summed. Separately, a request that cannot meet
its deadline even alone at the node's best degree (steps at the fastest degree, encode and
decode single-device, nothing queued before it) misses in every schedule; it is counted and
left out of the windows (which only loosens them).

The relaxation grants what no node has: work split across devices at no efficiency loss,
batching credit for every request, preemption at any instant and the future known. Noise:
the bound is on the profile's times; with timing noise on, true times scatter by a few
percent around them, so the bound is approximate to that order (the property test runs
noise-free).

**Clairvoyant reference.** ``clairvoyant_node_misses``: the single-device clairvoyant EDF
with give-up (``ditmem.scheduler.bound.clairvoyant_misses``) on the same D-times-faster
machine, with each request's standalone degree-1 time as its work — a schedule of the
relaxed machine, not of the node, so a reference point, not an achievable target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..bound import clairvoyant_misses, min_misses
from ..cost import CostModel
from ..request import Request
from .cost import NodeCost


class _PooledCost:
    """A CostModel view whose every duration is divided by ``devices`` (the relaxed machine);
    only what the single-device bound reads."""

    def __init__(self, cost: CostModel, devices: int):
        self._cost, self._d = cost, devices

    def tokens(self, request: Request) -> int:
        return self._cost.tokens(request)

    def encode_time(self, request: Request) -> float:
        return self._cost.encode_time(request) / self._d

    def decode_time(self, request: Request) -> float:
        return self._cost.decode_time(request) / self._d

    def profile_step_share(self, model: str, tokens: int, lo: int, hi: int) -> float:
        return self._cost.profile_step_share(model, tokens, lo, hi) / self._d

    def min_step_share(self, model: str, tokens: int) -> float:
        return self._cost.min_step_share(model, tokens) / self._d


def fastest_alone(request: Request, ncost: NodeCost, degrees: Sequence[int]) -> float:
    """Least seconds ``request`` can take from arrival to finish on the node: encode, its
    steps at the fastest degree, decode (profile times, no correction)."""
    cost = ncost.cost
    tokens = cost.tokens(request)
    step = min(
        cost.step_time(request.model, [tokens]) / ncost.speedup(request.model, tokens, d)
        for d in degrees
    )
    return cost.encode_time(request) + request.steps * step + cost.decode_time(request)


def check_speedups(ncost: NodeCost, requests: Sequence[Request], degrees: Sequence[int]) -> None:
    """The relaxation needs speed-up(d) ≤ d for every degree and shape of the trace."""
    for r in requests:
        n = ncost.cost.tokens(r)
        for d in degrees:
            if ncost.speedup(r.model, n, d) > d + 1e-9:
                raise ValueError(f"speed-up {ncost.speedup(r.model, n, d)} > degree {d}")


def min_node_misses(
    requests: Sequence[Request], ncost: NodeCost, devices: int, degrees: Sequence[int]
) -> int:
    """A lower bound on the misses of any schedule of ``requests`` on ``devices`` devices
    (module docstring). ``degrees``: the node's degrees."""
    if not requests:
        return 0
    check_speedups(ncost, requests, degrees)
    hopeless = [r for r in requests if r.arrival + fastest_alone(r, ncost, degrees) > r.deadline]
    out = {r.id for r in hopeless}
    rest = [r for r in requests if r.id not in out]
    if not rest:
        return len(hopeless)
    return len(hopeless) + min_misses(rest, _PooledCost(ncost.cost, devices))


def clairvoyant_node_misses(requests: Sequence[Request], ncost: NodeCost, devices: int) -> int:
    """Misses of the clairvoyant EDF-with-give-up on the D-times-faster machine (module
    docstring), standalone degree-1 times as works."""
    if not requests:
        return 0
    scaled = [replace(r, standalone_s=r.standalone_s / devices) for r in requests]
    return clairvoyant_misses(scaled, ncost.cost, "standalone")
