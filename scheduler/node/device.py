"""The device interface the node loop runs against, and its virtual implementation.

The loop (``ditmem.scheduler.node.simulator.run_node``) decides; devices execute. A ``Job``
is one group's work until its next decision point: moves of paused state (offloads from
the group's devices to the host, restores from the host, peer copies between groups; a move
starts only when every device it reads from or writes to is free — a source device may
still be running another job's step),
encodes of admitted members (single-device, spread over the group's devices), ``steps``
denoising steps of one packed batch at the group's degree, and decodes of the members whose
last step it runs (single-device, round-robin over the group: ``decode_lanes``). A job hands
its devices back one by one (``Completion``): after its last step the devices with no
decode, and each request as its own decode ends (its device with the last decode on it),
so a degree-2 job's second device does not idle in the first's decode and a request does
not wait for another's. A split decode (``Job.split_decodes``) hands each spare device back
as its own tiles end, or sooner when the loop takes it back between two tiles
(``NodeDevices.reclaim``; its tiles left run on the lane: :func:`split_ends`). ``NodeDevices``
is what an engine with
real devices implements (``launch`` hands a job to the group's workers, ``wait`` blocks for
the next completion or until a time); ``VirtualDevices`` draws every duration around the
node cost model with ``TimingNoise`` (the simulator's truth is not the policy's model).

Both execute a job with :func:`run_job`: the single-device loop's own order
(``ditmem.scheduler.loop.run_stages``) over the group's ``Stages`` (:class:`JobStages`), so
the node's order cannot drift from one device's. ``NodeDevices`` is the second, outer
interface only because a node runs jobs on several groups at once and hands completions
back as they come.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass, field
from typing import Protocol

from ..loop import Stages, run_stages
from ..noise import TimingNoise, shape_class, step_class
from ..request import Request
from .cost import NodeCost, busy_until, move_mask, spread
from .topology import Group

#: the seed offset of ``VirtualDevices``' launch draws (apart from every job's own stream,
#: ``noise.seed * 1_000_003 + job_id``)
LAUNCH_SEED = 2**40


@dataclass(slots=True)
class Move:
    """Make ``request``'s state resident on ``dst`` (None: park it on the host) from ``src``
    (None: it is on the host). ``kind`` ("offload", "restore", "peer", "host") and
    ``predicted_s`` (the policy's model, without the wait for busy devices) are set by the
    loop; devices report the measured seconds in ``Timings.move_s``."""

    request: Request
    src: Group | None
    dst: Group | None
    kind: str = ""
    predicted_s: float = 0.0


@dataclass(slots=True)
class Job:
    """One group's work until its next decision point (see the module docstring)."""

    job_id: int
    group: Group
    batch: list[Request]
    steps: int
    moves: list[Move] = field(default_factory=list)
    encodes: list[Request] = field(default_factory=list)
    decodes: list[Request] = field(default_factory=list)
    #: spread each decode's tiles over the group's spare devices (``decode_devices``)
    split_decodes: bool = False


@dataclass(slots=True)
class Timings:
    """Seconds a job spent per stage (transfers, encodes, steps, decodes), and waiting for
    devices held by other jobs (``wait_s``: its moves' sources, or its own group's devices
    still sending another job's move). ``launch_s``: the job's fixed cost besides its
    stages (``links.job_latency_s``: on ``VirtualDevices`` paid before its first stage; a
    real node's workers leave it 0, the loop's clock holds it). ``move_s``: each move's own
    seconds, in the job's order (what ``NodeCost.observe_move`` learns from; empty when a
    device does not time its moves one by one)."""

    transfer_s: float = 0.0
    encode_s: float = 0.0
    step_s: float = 0.0
    decode_s: float = 0.0
    wait_s: float = 0.0
    launch_s: float = 0.0
    move_s: list[float] = field(default_factory=list)
    #: (request id, devices its tiles ran on, seconds from its start to its image) per decode
    #: the devices measured whole (what ``NodeCost.observe_decode`` learns from; a split
    #: decode whose spare was taken back is left out)
    decodes: list[tuple[str, int, float]] = field(default_factory=list)

    @property
    def total(self) -> float:
        return (self.wait_s + self.launch_s + self.transfer_s + self.encode_s + self.step_s
                + self.decode_s)


@dataclass(slots=True)
class Completion:
    """Part or end of a job at ``finished``. After its last step a job hands its devices
    back one by one: ``stepped`` (its steps have ended; members that do not decode are
    paused now), ``released`` (devices whose work in the job is over), ``decoded``
    (requests whose decode ended: done, pages freed). ``last``: the job's final event; the
    loop then releases whatever devices, steps and decodes no earlier event named (a job
    reported in one event is just ``Completion(job, started, finished, timings)``).
    ``timings`` are the job's own (complete in the last event)."""

    job: Job
    started: float
    finished: float
    timings: Timings
    released: tuple[int, ...] = ()
    decoded: tuple[str, ...] = ()
    stepped: bool = False
    last: bool = True


class NodeDevices(Protocol):
    """What the node loop needs from the devices (virtual here, real in the node engine)."""

    def launch(self, job: Job, now: float) -> None:
        """Start ``job`` on its group at ``now`` (its devices are idle)."""

    def wait(self, until: float | None) -> list[Completion]:
        """The next job completions, all finishing at the same earliest time, if that is no
        later than ``until`` (None: wait for one); else an empty list."""

    def reclaim(self, job: Job, device: int, now: float) -> None:
        """Take ``device``, a spare of one of ``job``'s split decodes, back at ``now``: it
        ends the tile it is in and goes back to the loop (a ``Completion`` releasing it);
        its later tiles run on the decode's lane (:func:`split_ends`). A device whose tiles
        are done or in their last tile: nothing changes."""


def decode_lanes(group: Group, decodes: int) -> list[int]:
    """The device of each of a job's ``decodes`` decodes (in ``Job.decodes`` order):
    round-robin over ``group``'s devices, so device ``group.first + i`` decodes the i-th,
    (i + degree)-th, ... The simulator, the loop's prediction and the node engine share it."""
    return [group.devices[i % group.degree] for i in range(decodes)]


def lane_ends(group: Group, durations: list[float]) -> tuple[list[float], dict[int, float]]:
    """(each decode's end, each device's end) after a job's last step, in seconds from it,
    for decodes of ``durations`` run in order on their :func:`decode_lanes` devices (a
    device of the group with no decode: 0)."""
    clock = dict.fromkeys(group.devices, 0.0)
    ends = []
    for d, secs in zip(decode_lanes(group, len(durations)), durations, strict=True):
        clock[d] += secs
        ends.append(clock[d])
    return ends, clock


def decode_devices(group: Group, decodes: int, split: bool = False) -> list[tuple[int, ...]]:
    """The devices of each of a job's ``decodes`` decodes, its lane (:func:`decode_lanes`)
    first. With ``split`` and fewer decodes than devices, the spare devices join them:
    device ``group.devices[j]`` works on decode j mod ``decodes`` (a lone decode on a pair
    runs on both), each decode's tiles spread over its devices (``cost.split_tiles``), the
    lane blending them; otherwise one device each."""
    if not split or not 0 < decodes < group.degree:
        return [(d,) for d in decode_lanes(group, decodes)]
    return [tuple(group.devices[i::decodes]) for i in range(decodes)]


def decode_ends(group: Group, parts: list[tuple[list[float], float]], split: bool = False
                ) -> tuple[list[float], dict[int, float]]:
    """(each decode's end, each device's end) after a job's last step, in seconds from it.
    ``parts[i]``: decode i's (seconds of each of its devices' tiles, blend seconds), as
    ``NodeCost.decode_parts`` prices it over its :func:`decode_devices` (k = min(devices,
    tiles) entries: fewer than its devices when it has fewer tiles; the devices past k get
    no work, 0). A decode on one device runs its whole (``sum`` + blend) in lane order
    (:func:`lane_ends`). With ``split``, a decode of one entry is whole on its lane (one
    device, or one tile: ``([whole], 0.0)``); one of several is a split decode, its ends
    :func:`split_ends`' (each device's tiles as one, nothing taken back)."""
    sets = decode_devices(group, len(parts), split)
    if all(len(ds) == 1 for ds in sets):
        return lane_ends(group, [sum(p) + b for p, b in parts])
    clock = dict.fromkeys(group.devices, 0.0)  # split: each device in one decode's set
    ends = []
    for ds, (secs, blend) in zip(sets, parts, strict=True):
        if not 0 < len(secs) <= len(ds):
            raise ValueError(f"parts: {len(secs)} device parts for a decode on {ds}")
        if len(secs) == 1:  # whole, on its lane: not a split (split_ends needs a spare)
            clock[ds[0]] = secs[0] + blend
        else:
            _, per = split_ends([[s] for s in secs], blend)
            clock.update(zip(ds, per, strict=False))
        ends.append(clock[ds[0]])
    return ends, clock


def split_ends(tiles: list[list[float]], blend: float, taken: dict[int, float] | None = None
               ) -> tuple[float, list[float]]:
    """(the decode's end, each of its devices' ends), in seconds from the job's last step,
    of one split decode: ``tiles[i]`` the seconds of each tile device i of its
    :func:`decode_devices` runs, in order (device 0, the lane, blends after every tile is
    done, ``blend`` s; at least two devices: a decode on one is whole, :func:`decode_ends`).
    Without ``taken``: each spare ends with its own tiles, the lane (and the decode) with
    the slowest device's and then the blend. ``taken``: spare i (≥ 1) → when (s from the
    last step) the loop took it back (``NodeDevices.reclaim``): it ends the tile it is in
    then and stops; its later tiles run on the lane, after the lane's own and not before
    that tile's end (when the node engine's spare, asked before each tile, hands them over;
    several spares' in the order they are handed over)."""
    if len(tiles) < 2:
        raise ValueError(f"tiles: a split decode on {len(tiles)} device(s); needs 2 or more")
    ends = [sum(ts) for ts in tiles]
    handed: list[tuple[float, float]] = []  # (when a taken spare's tiles reach the lane, s)
    for i, at in (taken or {}).items():
        if not 0 < i < len(tiles):
            raise ValueError(f"taken: spare {i} of a decode on {len(tiles)} devices")
        clock = 0.0
        for k, secs in enumerate(tiles[i]):
            clock += secs
            if clock > at:  # the tile it is in when taken back
                left = sum(tiles[i][k + 1:])
                if left:
                    ends[i] = clock
                    handed.append((clock, left))
                break
    lane = ends[0]
    for when, left in sorted(handed):  # in the order they reach it
        lane = max(lane, when) + left
    end = max(lane, *ends[1:]) + blend
    ends[0] = end
    return end, ends


def run_job(job: Job, stages: Stages) -> None:
    """Execute ``job`` on ``stages`` (its group's, virtual or real) in the loop's order:
    ``ditmem.scheduler.loop.run_stages``, the single-device loop's own function. Its
    ``step`` returns the ids of ``job.decodes``."""
    run_stages(
        stages,
        offload=[mv.request.id for mv in job.moves if mv.dst is None],
        restore=[mv.request.id for mv in job.moves if mv.dst is not None],
        admit=[r.id for r in job.encodes],
        batch=[r.id for r in job.batch],
        steps=job.steps,
    )


class JobStages:
    """What every group's ``Stages`` for one job shares: the job, its ``Timings``, and its
    moves and requests by id. Transfers are synchronous (``finish_*`` do nothing)."""

    def __init__(self, job: Job):
        self.job = job
        self.timings = Timings()
        self.offloads = {mv.request.id: mv for mv in job.moves if mv.dst is None}
        self.restores = {mv.request.id: mv for mv in job.moves if mv.dst is not None}
        self.requests = {r.id: r for r in (*job.encodes, *job.batch)}

    def finish_offload(self, handle: object) -> None:
        """Nothing to wait for (the move ran in ``start_offload``)."""

    def finish_restore(self, handle: object) -> None:
        """Nothing to wait for (the move ran in ``start_restore``)."""


class _VirtualJob(JobStages):
    """One job on ``VirtualDevices``: every duration drawn around the truth; a move waits
    for its devices (``VirtualDevices.busy``) and holds the ones outside the job's group
    while it runs."""

    def __init__(self, devices: VirtualDevices, job: Job, start: float):
        super().__init__(job)
        self.truth = devices.truth
        self.draw = devices.noise.draw
        self.noise = devices.noise
        self.busy = devices.busy
        self.clock = start  # when the job's transfers have got to
        # seconds after the last step: each decode's end, each device's (``decode``)
        self.decode_ends: list[float] = []
        self.device_ends: dict[int, float] = {}
        self.split_tiles: list[_SplitTiles] = []  # the split decodes' drawn tiles
        self._jitter: TimingNoise | None = None

    def jitter(self):
        """The job's own unbiased draws (its split decodes' tiles), seeded by the noise's
        seed and the job: one stream for the job, its split decodes drawing from it in
        turn (not each from its start: their tiles' jitter would be the same)."""
        if self._jitter is None:
            n = self.noise
            self._jitter = TimingNoise(n.sigma, 0.0, n.seed * 1_000_003 + self.job.job_id)
        return self._jitter.draw

    def _move(self, mv: Move, secs: float) -> None:
        begin = busy_until(move_mask(mv.src, mv.dst), self.busy, self.clock)
        secs = self.draw(secs, "move", mv.kind)
        self.timings.wait_s += begin - self.clock
        self.timings.transfer_s += secs
        self.timings.move_s.append(secs)
        self.clock = begin + secs
        outside = move_mask(mv.src, mv.dst) & ~self.job.group.mask
        for d in range(len(self.busy)):
            if outside >> d & 1:
                self.busy[d] = max(self.busy[d], self.clock)

    def start_offload(self, rid: str) -> None:
        mv = self.offloads[rid]
        self._move(mv, self.truth.offload_time(mv.request, mv.src))

    def start_restore(self, rid: str) -> None:
        mv = self.restores[rid]
        self._move(mv, self.truth.move_time(mv.request, mv.src, mv.dst)[0])

    def encode(self, rids: list[str]) -> None:
        cost, draw = self.truth.cost, self.draw
        durations = [draw(cost.encode_time(r), "encode", shape_class(r))
                     for r in (self.requests[rid] for rid in rids)]
        self.timings.encode_s = spread(durations, self.job.group.degree)

    def step(self, rids: list[str], steps: int, blocks: int | None) -> list[str]:
        job, truth = self.job, self.truth
        if rids and steps:
            model = job.batch[0].model
            tokens = [truth.cost.tokens(r) for r in job.batch]
            step = truth.step_time(model, tokens, job.group.degree) / truth.correction(model)
            key = (step_class(job.batch), f"d{job.group.degree}")
            self.timings.step_s = sum(self.draw(step, "step", key) for _ in range(steps))
        return [r.id for r in job.decodes]

    def decode(self, rids: list[str]) -> None:
        job, draw = self.job, self.draw
        sets = decode_devices(job.group, len(job.decodes), job.split_decodes)
        parts = []
        for r, ds in zip(job.decodes, sets, strict=True):
            if len(ds) == 1:
                secs, blend = self.truth.decode_parts(r, 1)
                cls = shape_class(r)
                parts.append(([draw(s, "decode", cls) for s in secs],
                              draw(blend, "decode", cls) if blend else 0.0))
                self.timings.decodes.append((r.id, 1, sum(parts[-1][0])))
                continue
            # the decode's factor from the main stream (one draw, as a whole decode's), each
            # tile's and the blend's own jitter from the job's stream: a split does not
            # shift the other durations' draws (common random numbers across variants)
            tiles, blend = self.truth.decode_tile_parts(r, len(ds))
            if len(tiles) == 1:  # one tile: whole, on its lane
                parts.append(([draw(tiles[0][0], "decode", shape_class(r))], 0.0))
                self.timings.decodes.append((r.id, 1, parts[-1][0][0]))
                continue
            factor, jitter = draw(1.0, "decode", shape_class(r)), self.jitter()
            tiles = [[factor * jitter(t) for t in ts] for ts in tiles]
            blend = factor * jitter(blend) if blend else 0.0
            self.split_tiles.append(_SplitTiles(r, ds, tiles, blend))
            parts.append(([sum(ts) for ts in tiles], blend))
            self.timings.decodes.append((r.id, len(tiles), split_ends(tiles, blend)[0]))
        self.decode_ends, self.device_ends = decode_ends(job.group, parts, job.split_decodes)
        self.timings.decode_s = max(self.device_ends.values(), default=0.0)


@dataclass(slots=True)
class _SplitTiles:
    """One split decode's drawn tile seconds (per device of ``devices``, lane first), its
    blend, and the spares taken back (position → seconds after the last step)."""

    request: Request
    devices: tuple[int, ...]
    tiles: list[list[float]]
    blend: float
    taken: dict[int, float] = field(default_factory=dict)

    def ends(self) -> tuple[float, list[float]]:
        return split_ends(self.tiles, self.blend, self.taken)


@dataclass(slots=True)
class _SplitRun:
    """A split job's state on ``VirtualDevices`` until its last event: what ``reclaim``
    recomputes, and the heap sequence numbers of its events not yet handed out (by key: a
    device, or "last")."""

    job: Job
    started: float
    stepped: float
    timings: Timings
    decodes: list[_SplitTiles]
    pending: dict[object, int] = field(default_factory=dict)


class VirtualDevices:
    """Devices whose true times are drawn around ``truth`` (a NodeCost) with ``noise``.

    Each device is one worker doing one thing at a time: ``busy[d]`` is when device d's
    last job, or the last move reading from or writing to it, ends. A job starts when its
    group's devices are (the loop frees a group when its job ends, but a move of another
    job may still be reading from it), and each of its moves when the move's devices are.
    Its stages begin the truth's ``job_latency_s`` later (``Timings.launch_s``), so the
    loop's clock and every ``Completion`` hold it as on a real node: drawn, kind
    ``"launch"``, from a stream of its own (the noise's settings, seed ``LAUNCH_SEED +
    seed``), so a latency leaves every other duration's draw as it was (common random
    numbers across latencies).
    """

    def __init__(self, truth: NodeCost, noise: TimingNoise | None = None, devices: int = 0):
        self.truth = truth
        self.noise = noise if noise is not None else TimingNoise(sigma=0.0)
        self._heap: list[tuple[float, int, Completion]] = []
        self._seq = 0
        self.link_busy_s = 0.0
        self.busy: list[float] = [0.0] * devices
        self._splits: dict[int, _SplitRun] = {}  # split jobs until their last event
        self._cancelled: set[int] = set()  # heap entries ``reclaim`` replaced
        self._launch_noise: TimingNoise | None = None  # the launches' stream (class doc)

    def timings(self, job: Job, now: float = 0.0) -> Timings:
        """Run ``job`` launched at ``now``: its stages' true seconds (waits included)."""
        return self._run(job, now)[0]

    def _run(self, job: Job, now: float) -> tuple[Timings, _VirtualJob]:
        top = max(job.group.devices[-1], *(
            g.devices[-1] for mv in job.moves for g in (mv.src, mv.dst) if g is not None
        ), 0) + 1
        if len(self.busy) < top:
            self.busy.extend([0.0] * (top - len(self.busy)))
        start = busy_until(job.group.mask, self.busy, now)
        launch = self._launch(self.truth.job_latency_s)
        stages = _VirtualJob(self, job, start + launch)
        stages.timings.wait_s = start - now
        stages.timings.launch_s = launch
        run_job(job, stages)
        self.link_busy_s += stages.timings.transfer_s
        t = stages.timings
        stepped = now + t.total - t.decode_s
        for d in job.group.devices:
            self.busy[d] = max(self.busy[d], stepped + stages.device_ends.get(d, 0.0))
        return t, stages

    def _launch(self, latency: float) -> float:
        """One job's drawn fixed seconds around ``latency`` (the class docstring)."""
        if latency <= 0:
            return 0.0
        if self._launch_noise is None:
            self._launch_noise = dataclasses.replace(self.noise,
                                                     seed=LAUNCH_SEED + self.noise.seed)
        return self._launch_noise.draw(latency, "launch")

    def launch(self, job: Job, now: float) -> None:
        """Queue ``job``'s events: one at its end when it decodes nothing; else its last
        step's end (devices without a decode handed back), each decode's end (with its
        device when that decode is the device's last), and the job's end."""
        t, stages = self._run(job, now)
        if not job.decodes:
            self._push(Completion(job, now, now + t.total, t))
            return
        stepped = now + t.total - t.decode_s
        sets = decode_devices(job.group, len(job.decodes), job.split_decodes)
        if any(len(ds) > 1 for ds in sets):
            self._push_split(job, now, stepped, t, stages)
            return
        lanes = decode_lanes(job.group, len(job.decodes))
        idle = tuple(d for d in job.group.devices if d not in lanes)
        self._push(Completion(job, now, stepped, t, idle, stepped=True, last=False))
        last_of = {d: i for i, d in enumerate(lanes)}
        end = stepped
        for i, (r, d, secs) in enumerate(zip(job.decodes, lanes, stages.decode_ends,
                                             strict=True)):
            freed = (d,) if last_of[d] == i else ()
            end = max(end, stepped + secs)
            self._push(Completion(job, now, stepped + secs, t, freed, (r.id,), last=False))
        self._push(Completion(job, now, end, t))  # with the last decode, not before it

    def _push_split(self, job: Job, now: float, stepped: float, t: Timings,
                    stages: _VirtualJob) -> None:
        """A split job's events: its last step's end (devices with no work handed back),
        each device's end with its tiles (a lane's: with its decode's blend, the request
        done), and the job's end. Kept until the job's end for ``reclaim``."""
        ends = stages.device_ends
        idle = tuple(d for d in job.group.devices if ends[d] == 0.0)
        self._push(Completion(job, now, stepped, t, idle, stepped=True, last=False))
        run = _SplitRun(job, now, stepped, t, stages.split_tiles)
        self._splits[job.job_id] = run
        self._push_split_ends(run, ends)

    def _push_split_ends(self, run: _SplitRun, ends: dict[int, float]) -> None:
        job, stepped = run.job, run.stepped
        lane_of = {ds[0]: r for r, ds in zip(
            job.decodes, decode_devices(job.group, len(job.decodes), True), strict=True)}
        keys = set(run.pending) if run.pending else set(job.group.devices) | {"last"}
        run.pending = {}
        for d in job.group.devices:
            if ends[d] == 0.0 or d not in keys:
                continue
            done = (lane_of[d].id,) if d in lane_of else ()
            run.pending[d] = self._push(Completion(job, run.started, stepped + ends[d],
                                                   run.timings, (d,), done, last=False))
        run.pending["last"] = self._push(Completion(job, run.started,
                                                    stepped + max(ends.values()), run.timings))

    def reclaim(self, job: Job, device: int, now: float) -> None:
        """``NodeDevices.reclaim``: the spare ``device`` of ``job``'s split decode ends the
        tile it is in at ``now`` and goes back; its later tiles run on the lane
        (:func:`split_ends`); the job's events not yet handed out move with it."""
        run = self._splits.get(job.job_id)
        if run is None or device not in run.pending:
            return
        split = next((sp for sp in run.decodes if device in sp.devices[1:]), None)
        if split is None:
            raise ValueError(f"reclaim: device {device} is no spare of job {job.job_id}")
        pos = split.devices.index(device)
        if pos in split.taken:
            return
        before = split.ends()
        split.taken[pos] = max(0.0, now - run.stepped)
        after = split.ends()
        if after == before:
            return
        ends = dict.fromkeys(job.group.devices, 0.0)
        for sp in run.decodes:
            _, per = sp.ends()
            ends.update(zip(sp.devices, per, strict=True))
        for d in job.group.devices:  # devices outside every split decode: as launched
            if ends[d] == 0.0 and d in run.pending:
                ends[d] = self._heap_time(run.pending[d]) - run.stepped
        for d, e in ends.items():
            self.busy[d] = run.stepped + e if e else self.busy[d]
        run.timings.decode_s = max(ends.values(), default=0.0)
        rid = split.request.id  # no longer a whole split decode: not learned from
        run.timings.decodes[:] = [e for e in run.timings.decodes if e[0] != rid]
        for seq in run.pending.values():
            self._cancelled.add(seq)
        self._push_split_ends(run, ends)

    def _heap_time(self, seq: int) -> float:
        return next(t for t, q, _ in self._heap if q == seq)

    def _push(self, done: Completion) -> int:
        self._seq += 1  # same time: in the order pushed
        heapq.heappush(self._heap, (done.finished, self._seq, done))
        return self._seq

    def wait(self, until: float | None) -> list[Completion]:
        self._drop_cancelled()
        if not self._heap or (until is not None and self._heap[0][0] > until):
            return []
        first = self._heap[0][0]
        out = []
        while self._heap and self._heap[0][0] == first:
            _, seq, done = heapq.heappop(self._heap)
            if seq in self._cancelled:
                self._cancelled.discard(seq)
                continue
            out.append(done)
            run = self._splits.get(done.job.job_id)
            if run is not None:
                run.pending = {k: q for k, q in run.pending.items() if q != seq}
                if done.last:
                    del self._splits[done.job.job_id]
            self._drop_cancelled()
        return out

    def _drop_cancelled(self) -> None:
        while self._heap and self._heap[0][1] in self._cancelled:
            self._cancelled.discard(heapq.heappop(self._heap)[1])

    def __len__(self) -> int:
        return len(self._heap) - len(self._cancelled)
