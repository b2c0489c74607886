"""Predicted times on a node: steps at a sequence-parallel degree, moves of paused state.

``NodeCost`` wraps the single-device ``CostModel`` (batch-1 and packed step times, encode,
decode, state bytes) and the profile's ``parallel``/``links`` sections. A packed step of
token counts ``n_i`` at degree d costs ``cost.step_time(n) / speedup(Σ n_i, d)``. Encode and
decode are single-device stages. A started request's state is token-sharded over its group
(device at position p of a group of degree d holds the fraction [p/d, (p+1)/d)); moving it:

* from the host: each device of the new group reads its shard over its own host link,
  ``bytes / d_new / host_bw``;
* between groups: a peer copy of what each new device lacks (re-sharding), the largest
  receiver's bytes over the peer link — or through the host (offload + restore) when that
  is cheaper.
Every move command also costs the links' fixed ``move_latency_s`` (a move through the host
is two: offload and restore), and each kind of move ("restore", "peer", "host", "offload")
learns a measured/predicted factor online (``observe_move``, EWMA) as steps do.

Every job costs the links' fixed ``job_latency_s`` besides its stages (the launch command,
the job's thread, the completion's way back): a request's remaining or standalone time
(``remaining``, ``standalone``) adds it once per job the policy will launch for the steps
left — ``steps_per_job`` steps a job (``ceil(steps left / steps_per_job)`` jobs, at least
one; None: the whole rest in one job, as a run-to-completion policy launches it). Step
times (``step_time``, ``alone_step``, ``base_step_time``) leave it out: a packing gain is
judged in the profile's units, and a job of k steps pays it once, not k times.

A move reads from and writes to devices (``move_mask``): it cannot start before every one
of them is free, i.e. before the job running there (another request's step) ends —
``move_wait`` prices that from the devices' busy-until times.
Step times learn online, measured/predicted factors (EWMA) per *shape class* (model, total
tokens of the batch in half-octaves, degree), per (model, degree) and per model; a step is
priced with the most specific factor measured (a real node's drift differs by class and by
degree: session 11's run, degree-2 steps of 256² ×1.26, of 1024² ×1.12, degree 1 ×1.11).
Packing gains are judged in the profile's units (``base_step_time``), as on one device, so
two classes' different factors are not taken for a gain. Encodes learn one factor per
model (``observe_encode``). The CostModel's own times are read once per batch shape (the
node never feeds it: the simulator's truth may share it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..cost import CostModel, _decode_bucket, _octave_bucket
from ..request import Request
from .speedup import ParallelProfile
from .topology import Group

#: The kinds of move a NodeCost prices (and learns a factor for): from the host onto a
#: group, a peer copy between groups, between groups through the host (offload + restore),
#: a park on the host.
MOVE_KINDS = ("restore", "peer", "host", "offload")
#: Bytes per decoded pixel of a tile sent back to the blending device (3 float32 channels).
TILE_BYTES_PER_PIXEL = 12
#: Move commands per kind (each pays ``Links.move_latency_s``).
_COMMANDS = {"restore": 1, "peer": 1, "host": 2, "offload": 1}


def split_tiles(tiles: int, devices: int) -> list[list[int]]:
    """The tile indices (row-major, as ``TiledDecode`` numbers them) each of ``devices``
    devices decodes when one decode is spread over them: tile t on the (t mod k)-th, k =
    min(devices, tiles). The simulator's price and the node engine's split share it."""
    k = max(1, min(devices, tiles))
    return [list(range(i, tiles, k)) for i in range(k)]


def move_mask(src: Group | None, dst: Group | None) -> int:
    """Devices (bit mask) a move of paused state reads from or writes to: ``src``'s devices
    (None: the host) and ``dst``'s (None: a park on the host)."""
    return (0 if src is None else src.mask) | (0 if dst is None else dst.mask)


def spread(durations: list[float], devices: int) -> float:
    """Wall time of single-device stages spread round-robin over ``devices`` devices."""
    if len(durations) <= 1:
        return durations[0] if durations else 0.0
    loads = [0.0] * max(1, devices)
    for i, d in enumerate(durations):
        loads[i % len(loads)] += d
    return max(loads, default=0.0)


def busy_until(mask: int, busy: Sequence[float], now: float) -> float:
    """When every device of ``mask`` is free: the latest of ``busy[d]`` (the predicted end
    of what device d runs) over the mask's devices, at least ``now``."""
    end = now
    while mask:
        low = mask & -mask
        d = low.bit_length() - 1
        if d < len(busy) and busy[d] > end:
            end = busy[d]
        mask ^= low
    return end


def reshard_fraction(src: Group, dst: Group) -> float:
    """Largest fraction of a request's state any device of ``dst`` must receive when the
    state moves from ``src`` (token-contiguous shards; 0 when ``src == dst``)."""
    worst = 0.0
    for q, dev in enumerate(dst.devices):
        lo, hi = q / dst.degree, (q + 1) / dst.degree
        held = 0.0
        if dev in src.devices:
            p = dev - src.first
            held = max(0.0, min(hi, (p + 1) / src.degree) - max(lo, p / src.degree))
        worst = max(worst, (hi - lo) - held)
    return worst


class NodeCost:
    """Node-level predictions over a ``CostModel`` (see the module docstring)."""

    def __init__(
        self,
        cost: CostModel,
        parallel: ParallelProfile | None = None,
        *,
        correction_alpha: float = 0.1,
    ):
        self.cost = cost
        self.parallel = parallel if parallel is not None else ParallelProfile(cost.profile)
        self.links = self.parallel.links
        self.name = cost.name
        self._alpha = correction_alpha
        self._correction: dict[str, float] = {}
        self._step_correction: dict[tuple, float] = {}
        self._encode_correction: dict[str, float] = {}
        self._move_correction: dict[str, float] = {}
        self._decode_correction: dict[tuple[str, int], float] = {}
        self._alone: dict[tuple[str, int, int], float] = {}
        self._batch: dict[tuple, float] = {}

    # ---- steps -----------------------------------------------------------------------
    def speedup(self, model: str, tokens: float, degree: int) -> float:
        return self.parallel.speedup(model, tokens, degree)

    def correction(self, model: str) -> float:
        """The model's measured/predicted step factor over all its classes and degrees (1.0
        before feedback)."""
        return self._correction.get(model, 1.0)

    def step_correction(self, model: str, tokens: Sequence[int], degree: int = 1) -> float:
        """The factor a step of a batch of ``tokens`` (its members' token counts, as
        ``CostModel.step_correction``) at ``degree`` is priced with: its shape class's, else
        its degree's, else its model's."""
        factor = self._step_correction.get((model, _octave_bucket(sum(tokens)), degree))
        if factor is None:
            factor = self._step_correction.get((model, degree))
        return self.correction(model) if factor is None else factor

    def base_step_time(self, model: str, tokens: Sequence[int], degree: int = 1) -> float:
        """The profile's seconds for one step of a packed batch at ``degree``, no learned
        factor: what a packing gain is judged in (module docstring)."""
        if not tokens:
            return 0.0
        key = (model, tuple(sorted(tokens)), degree)
        base = self._batch.get(key)
        if base is None:
            base = self.cost.step_time(model, tokens) / self.speedup(model, sum(tokens), degree)
            self._batch[key] = base
        return base

    def step_time(self, model: str, tokens: Sequence[int], degree: int = 1) -> float:
        """Seconds for one step of a packed batch (token counts ``tokens``) at ``degree``."""
        if not tokens:
            return 0.0
        return self.base_step_time(model, tokens, degree) * self.step_correction(
            model, tokens, degree)

    def base_alone_step(self, request: Request, degree: int = 1) -> float:
        """The profile's seconds of one step of ``request`` alone at ``degree``."""
        key = (request.model, self.cost.tokens(request), degree)
        base = self._alone.get(key)
        if base is None:
            base = self.cost.step_time(request.model, [key[1]]) / self.speedup(
                request.model, key[1], degree
            )
            self._alone[key] = base
        return base

    def alone_step(self, request: Request, degree: int = 1) -> float:
        """Seconds of one step of ``request`` alone at ``degree``."""
        return self.base_alone_step(request, degree) * self.step_correction(
            request.model, [self.cost.tokens(request)], degree)

    def encode_time(self, request: Request) -> float:
        """Seconds of ``request``'s prompt encode (the profile's, learned factor included)."""
        return self.cost.encode_time(request) * self._encode_correction.get(request.model, 1.0)

    @property
    def job_latency_s(self) -> float:
        """Seconds every job costs besides its stages (``Links.job_latency_s``)."""
        return self.links.job_latency_s

    def jobs_latency(self, steps_left: int, steps_per_job: int | None = None) -> float:
        """Seconds of the fixed job cost of the jobs that run ``steps_left`` steps,
        ``steps_per_job`` a job (None: one job for them all): ``job_latency_s`` ×
        ``max(1, ceil(steps_left / steps_per_job))``."""
        if steps_per_job is not None and steps_per_job < 1:
            raise ValueError(f"steps_per_job: an integer >= 1 or None, got {steps_per_job!r}")
        if not self.links.job_latency_s:
            return 0.0
        jobs = 1 if steps_per_job is None else max(1, -(-steps_left // steps_per_job))
        return jobs * self.links.job_latency_s

    def remaining(self, request: Request, steps_done: int, degree: int = 1,
                  steps_per_job: int | None = None) -> float:
        """Seconds still needed alone at ``degree``: steps left + decode (+ encode when it
        has not started) + the fixed cost of each job launched for them
        (:meth:`jobs_latency`: ``steps_per_job`` steps a job; None: one job)."""
        left = request.steps - steps_done
        rest = left * self.alone_step(request, degree)
        rest += self.decode_time(request) + self.jobs_latency(left, steps_per_job)
        return rest + (self.encode_time(request) if steps_done == 0 else 0.0)

    def decode_parts(self, request: Request, devices: int = 1) -> tuple[list[float], float]:
        """(seconds of each device's tiles, seconds of the blend after them) of ``request``'s
        decode with its tiles spread over ``devices`` devices (tile t on the t mod k-th,
        :func:`split_tiles`; k = min(devices, tiles)). The first device, the decode's lane,
        also blends: the other devices' tiles come back to it through host memory
        (``TILE_BYTES_PER_PIXEL`` per pixel of their share of the image over the host link)
        and three commands pay the links' fixed latency (the latent shared, the tiles, the
        blend). One device or one tile: ``([whole decode], 0.0)``."""
        tiles, blend = self.decode_tile_parts(request, devices)
        return [sum(ts) for ts in tiles], blend

    def decode_tile_parts(self, request: Request, devices: int = 1
                          ) -> tuple[list[list[float]], float]:
        """:meth:`decode_parts` tile by tile: (per device, the seconds of each of its tiles
        in the order it runs them; the blend's seconds). One device or one tile:
        ``([[whole decode]], 0.0)``."""
        tiles = self.cost.decode_tiles(request)
        factor = self.decode_correction(request)
        if factor != 1.0:
            tiles = [t * factor for t in tiles]
        k = min(devices, len(tiles))
        if k <= 1:
            return [[sum(tiles)]], 0.0
        parts = [tiles[i::k] for i in range(k)]
        others = 1.0 - sum(parts[0]) / sum(tiles)
        pixels = request.width * request.height * request.frames
        moved = pixels * others * TILE_BYTES_PER_PIXEL / self.links.host_bytes_per_s
        return parts, moved + 3 * self.links.move_latency_s

    def decode_correction(self, request: Request) -> float:
        """The learned measured/predicted factor of decodes of ``request``'s shape class
        (model, half-octave of megapixels; 1 until observed: ``observe_decode``)."""
        return self._decode_correction.get((request.model, _decode_bucket(request)), 1.0)

    def decode_time(self, request: Request) -> float:
        """Seconds of ``request``'s whole decode on one device (the profile's, learned
        factor included)."""
        return self.cost.decode_time(request) * self.decode_correction(request)

    def observe_decode(self, request: Request, devices: int, measured_s: float) -> None:
        """Fold one measured decode (``measured_s`` from its start to its image) of its
        tiles spread over ``devices`` devices (1: whole, on one) into its shape class's
        factor: the tiles' part is what scales (``measured − blend`` against the slowest
        device's tiles); the node engine reports each decode no spare of which was taken
        back. Kept here, not in the CostModel (whose decode factors the simulator's truth
        shares)."""
        if not (measured_s > 0 and math.isfinite(measured_s)) or devices < 1:
            return
        base = self.cost.decode_tiles(request)
        k = min(devices, len(base))
        tiles_s = max(sum(base[i::k]) for i in range(k)) if k > 1 else sum(base)
        blend = self.decode_tile_parts(request, devices)[1] if k > 1 else 0.0
        if tiles_s <= 0 or measured_s <= blend:
            return
        key = (request.model, _decode_bucket(request))
        old = self._decode_correction.get(key, 1.0)
        ratio = (measured_s - blend) / tiles_s
        self._decode_correction[key] = (1 - self._alpha) * old + self._alpha * ratio

    def standalone(self, request: Request, degree: int = 1,
                   steps_per_job: int | None = None) -> float:
        """Seconds of ``request`` alone at ``degree`` from its start (:meth:`remaining` of
        all its steps; one job by default, as a run to completion)."""
        return self.remaining(request, 0, degree, steps_per_job)

    # ---- memory and moves ------------------------------------------------------------
    def shard_pages(self, request: Request, degree: int, page_bytes: int) -> int:
        """Pages each device of a group of ``degree`` holds for the request's state."""
        return max(1, math.ceil(self.cost.state_bytes(request) / degree / page_bytes))

    def move_correction(self, kind: str) -> float:
        """The learned measured/predicted factor of moves of ``kind`` (1 until observed)."""
        return self._move_correction.get(kind, 1.0)

    def _priced(self, kind: str, link_s: float) -> float:
        latency = _COMMANDS[kind] * self.links.move_latency_s
        return (link_s + latency) * self._move_correction.get(kind, 1.0)

    def restore_time(self, request: Request, dst: Group) -> float:
        """Seconds to bring the state from the host into ``dst`` (shards in parallel)."""
        return self._priced("restore", self._host_s(request, dst))

    def offload_time(self, request: Request, src: Group) -> float:
        """Seconds to park the state of a request resident on ``src`` in the host pool."""
        return self._priced("offload", self._host_s(request, src))

    def peer_time(self, request: Request, src: Group, dst: Group) -> float:
        """Seconds of a peer copy re-sharding the state from ``src`` to ``dst``."""
        return self._priced("peer", self._peer_s(request, src, dst))

    def _host_s(self, request: Request, group: Group) -> float:
        return self.cost.state_bytes(request) / group.degree / self.links.host_bytes_per_s

    def _peer_s(self, request: Request, src: Group, dst: Group) -> float:
        nbytes = self.cost.state_bytes(request) * reshard_fraction(src, dst)
        return nbytes / self.links.device_bytes_per_s

    def move_time(self, request: Request, src: Group | None, dst: Group) -> tuple[float, str]:
        """(seconds, "none" | "restore" | "peer" | "host") to make the state resident on
        ``dst``; ``src`` None means it is on the host. Not counting the wait for the
        devices to be free (``move_wait``)."""
        if src is None:
            return self.restore_time(request, dst), "restore"
        if src == dst:
            return 0.0, "none"
        peer = self.peer_time(request, src, dst)
        via_host = self._priced("host", self._host_s(request, src) + self._host_s(request, dst))
        return (peer, "peer") if peer <= via_host else (via_host, "host")

    @staticmethod
    def move_wait(
        src: Group | None, dst: Group | None, busy: Sequence[float], now: float
    ) -> float:
        """Seconds from ``now`` until every device the move reads from or writes to is free
        (``busy[d]``: when device d's current job ends, as predicted)."""
        return busy_until(move_mask(src, dst), busy, now) - now

    # ---- feedback --------------------------------------------------------------------
    def observe_step(
        self, model: str, tokens: Sequence[int], degree: int, steps: int, measured_s: float
    ) -> None:
        """Fold ``steps`` measured steps (``measured_s`` in all) of a batch of ``tokens`` at
        ``degree`` into its shape class's, its degree's and its model's factors."""
        if steps <= 0 or not (measured_s > 0 and math.isfinite(measured_s)) or not tokens:
            return
        ratio = measured_s / (self.base_step_time(model, tokens, degree) * steps)
        a = self._alpha
        olds = {(model, _octave_bucket(sum(tokens)), degree):
                self.step_correction(model, tokens, degree),
                (model, degree): self._step_correction.get((model, degree),
                                                           self.correction(model))}
        for key, old in olds.items():
            self._step_correction[key] = (1 - a) * old + a * ratio
        self._correction[model] = (1 - a) * self.correction(model) + a * ratio

    def observe_encode(self, requests: Sequence[Request], degree: int, measured_s: float
                       ) -> None:
        """Fold one job's encodes (``requests``, spread round-robin over the ``degree``
        devices of its group; ``measured_s`` from the first start to the last end) into
        their model's encode factor."""
        if not requests or not (measured_s > 0 and math.isfinite(measured_s)):
            return
        predicted = spread([self.cost.encode_time(r) for r in requests], degree)
        if predicted <= 0:
            return
        model = requests[0].model
        old = self._encode_correction.get(model, 1.0)
        self._encode_correction[model] = (1 - self._alpha) * old + self._alpha * (
            measured_s / predicted)

    def observe_move(self, kind: str, predicted_s: float, measured_s: float) -> None:
        """Fold one measured move into the factor of its ``kind`` (one of ``MOVE_KINDS``).

        ``predicted_s``: what this NodeCost predicted for the move (``move_time`` /
        ``restore_time`` / ``offload_time``, its factor at the time included); ``measured_s``:
        the move's own seconds — from the moment its devices were free to its end, not the
        wait for another job's step on them (that is priced apart, ``move_wait``). A move of
        no predicted or measured time teaches nothing.
        """
        if kind not in _COMMANDS:
            raise ValueError(f"kind: one of {', '.join(MOVE_KINDS)}, got {kind!r}")
        if not (predicted_s > 0 and measured_s > 0) or not math.isfinite(measured_s / predicted_s):
            return
        old = self.move_correction(kind)
        unit = predicted_s / old  # the prediction without the factor
        self._move_correction[kind] = (1 - self._alpha) * old + self._alpha * measured_s / unit
