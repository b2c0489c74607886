"""``simulate``: a deterministic discrete-event replay of the engine loop on one device.

Each iteration runs through ``ditmem.scheduler.loop.run_stages``, the function the real
engine's executor runs too; ``_Engine`` is its virtual device (pages, host link, durations
drawn around the profile)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .block_step import BlockPlanError, run_chunk
from .cost import CostModel
from .decode_lane import DECODE_MODES, LATE_SHARE, DecodeLane, TiledDecodes, step_deadline
from .loop import mid_step, preempted, run_stages
from .noise import TimingNoise, shape_class, step_class
from .parking import HostLink, Parking
from .plan import MemoryState, PendingDecode, SchedulerView, StepPlan, StepReport
from .policies.base import Policy
from .queue import WaitingQueue
from .request import Location, Request, RequestStatus

#: Most started (running + paused) requests per device, as the engine's default (DESIGN.md).
DEFAULT_MAX_ACTIVE = 64
#: Plans that only move memory (no step) allowed in a row before the run is declared stuck.
MAX_MOVES_WITHOUT_STEP = 1000
#: Preemption granularities: between steps, or also between chunks of transformer blocks.
PREEMPTION_MODES = ("step", "block")


class PlanError(RuntimeError):
    """A policy returned a plan the engine could not execute (names the broken rule)."""


@dataclass(slots=True)
class Record:
    """The outcome of one request: when it arrived, started and finished (seconds), how
    often it was preempted, offloaded, parked inside a step (block preemption) and moved
    between device groups (a node), and its steps per sequence-parallel degree (a node's
    runs: ``{degree: steps}``; empty where the runner has one device)."""

    request: Request
    started: float
    finished: float
    preemptions: int
    offloads: int
    parks: int = 0
    migrations: int = 0
    degrees: dict[int, int] = field(default_factory=dict)

    @property
    def latency(self) -> float:
        return self.finished - self.request.arrival

    @property
    def met(self) -> bool:
        return self.finished <= self.request.deadline + 1e-9


@dataclass(slots=True)
class SimResult:
    records: list[Record]
    makespan: float
    iterations: int
    busy_s: float
    batch_sizes: dict[int, int] = field(default_factory=dict)
    chunks: int = 0
    parks: int = 0
    link_busy_s: float = 0.0
    overhead_s: float = 0.0


@dataclass(slots=True)
class _Iteration:
    """What the simulated device measured in one iteration (seconds, and who ran)."""

    now: float
    encoded: list[Request]
    finished: list[RequestStatus]
    transfer_s: float = 0.0
    encode_s: float = 0.0
    step_s: float = 0.0
    overhead_s: float = 0.0
    decode_s: float = 0.0
    moved: int = 0
    charged: bool = False
    members: list[RequestStatus] | None = None  # set by the step stage (always run)
    model: str = ""
    tokens: list[int] | None = None
    blocks: int | None = None


class _Engine:
    """The simulated device: pages, host pool, and the requests it holds. It implements
    ``ditmem.scheduler.loop.Stages``: the plan's page moves are accounted when they start
    and charged as one copy on the host link before the next stage that uses the device;
    every duration is drawn by ``noise`` around ``cost`` (the truth)."""

    def __init__(
        self,
        cost: CostModel,
        model: str,
        page_bytes: int,
        device_pages: int | None,
        max_active: int | None,
        preemption: str = "step",
        noise: TimingNoise | None = None,
        chunk_blocks: Callable[[list[Request]], int] | None = None,
        inline_decode: bool = True,
    ):
        self.cost = cost
        self.preemption = preemption
        self.noise = noise if noise is not None else TimingNoise(sigma=0.0)
        self.link = HostLink(cost, noise)
        self.parking = Parking(cost, self.link, page_bytes)
        self.parks: dict[str, int] = {}
        self.max_active = max_active
        self.page_bytes = page_bytes
        self.total = (
            device_pages if device_pages is not None else cost.device_pages(model, page_bytes)
        )
        self.free = self.total
        self.host_free = cost.host_pages(page_bytes)
        self.waiting = WaitingQueue()
        self.active: dict[str, RequestStatus] = {}
        self.offloads: dict[str, int] = {}
        self.chunk_blocks = chunk_blocks
        self.inline_decode = inline_decode
        self.it = _Iteration(0.0, [], [])

    def view(self, last_batch: tuple[str, ...],
             decodes: tuple[PendingDecode, ...] = ()) -> SchedulerView:
        memory = MemoryState(self.total, self.free, self.page_bytes, self.host_free)
        return SchedulerView(
            list(self.active.values()),
            self.waiting,
            memory,
            last_batch,
            self.max_active,
            self.preemption,
            decodes,
        )

    # ------------------------------------------------------------------ Stages
    def start_offload(self, rid: str) -> None:
        s = self._active(rid, "offload")
        if s.location is not Location.DEVICE:
            raise PlanError(f"offload of {rid!r}: it is not on the device")
        if self.host_free < s.pages:
            raise PlanError(f"offload of {rid!r}: host pool full")
        self._relocate(s, Location.HOST)
        self.offloads[rid] = self.offloads.get(rid, 0) + 1

    def finish_offload(self, handle: object) -> None:
        """Nothing to wait for: the copy is charged on the link (``_charge_moves``)."""

    def start_restore(self, rid: str) -> None:
        s = self._active(rid, "restore")
        if s.location is not Location.HOST:
            raise PlanError(f"restore of {rid!r}: it is not on the host")
        if self.free < s.pages:
            raise PlanError(f"restore of {rid!r}: needs {s.pages} pages, {self.free} free")
        self._relocate(s, Location.DEVICE)

    def finish_restore(self, handle: object) -> None:
        """Nothing to wait for: the copy is charged on the link (``_charge_moves``)."""

    def encode(self, rids: Sequence[str]) -> None:
        self._charge_moves()
        it, truth = self.it, self.cost
        for rid in rids:
            if rid not in self.waiting:
                raise PlanError(f"admit of {rid!r}: not waiting")
            req = self.waiting.get(rid)
            pages = truth.pages_for(req, self.page_bytes)
            if self.free < pages:
                raise PlanError(f"admit of {rid!r}: needs {pages} pages, {self.free} free")
            if self.max_active is not None and len(self.active) >= self.max_active:
                raise PlanError(f"admit of {rid!r}: {self.max_active} requests already started")
            self.waiting.remove(rid)
            self.free -= pages
            self.active[rid] = RequestStatus(req, started_at=it.now, pages=pages)
            it.encode_s += self.noise.draw(truth.encode_time(req), "encode", shape_class(req))
            it.encoded.append(req)

    def step(self, rids: Sequence[str], steps: int, blocks: int | None) -> list[str]:
        it, truth = self.it, self.cost
        if not it.charged:
            self._charge_moves()
        members = [self._active(rid, "batch") for rid in rids]
        it.members = members
        it.model = model = _check_batch(members, truth)
        it.tokens = tokens = [truth.tokens(s.request) for s in members]
        if self.preemption == "block":
            plan = StepPlan(batch=list(rids), blocks=blocks)
            start = it.now + it.transfer_s
            try:
                out = run_chunk(self, plan, members, model, truth, self.chunk_blocks, start)
            except BlockPlanError as exc:
                raise PlanError(str(exc)) from exc
            # The preemption point's overhead is not step compute (the cost model's feedback
            # compares step_s with predicted block time).
            it.transfer_s += out.wait_s
            it.step_s = self.noise.draw(out.compute_s, "step", _step_key(members))
            it.overhead_s = out.overhead_s
            stepped, it.blocks = out.stepped, out.blocks
        else:
            it.step_s = (self.noise.draw(truth.step_time(model, tokens), "step", _step_key(members))
                         if members else 0.0)
            stepped = members
        finished = it.finished
        for s in stepped:
            s.steps_done += 1
            if s.steps_done == s.request.steps:
                finished.append(s)
        return [s.id for s in finished] if finished else []

    def decode(self, rids: list[str]) -> None:
        if not self.inline_decode:
            return  # the decode lane or the tiles run it after the iteration
        for rid in rids:
            req = self.active[rid].request
            self.it.decode_s += self.noise.draw(self.cost.decode_time(req), "decode",
                                                shape_class(req))

    def _relocate(self, s: RequestStatus, to: Location) -> None:
        """Account ``s``'s pages moving to ``to`` (the host or the device)."""
        pages = s.pages if to is Location.HOST else -s.pages
        s.location, self.free, self.host_free = to, self.free + pages, self.host_free - pages
        self.it.moved += s.pages

    def _charge_moves(self) -> None:
        """Charge the iteration's page moves as one copy on the host link (once)."""
        it = self.it
        if not it.charged:
            it.charged = True
            if it.moved:
                it.transfer_s += self.link.copy(it.now, it.moved * self.page_bytes) - it.now

    def _active(self, rid: str, what: str) -> RequestStatus:
        s = self.active.get(rid)
        if s is None:
            raise PlanError(f"{what} of {rid!r}: not an active request")
        return s


def simulate(
    requests: Sequence[Request],
    policy: Policy,
    cost: CostModel | None = None,
    *,
    slo_scale: float = 3.0,
    page_bytes: int | None = None,
    device_pages: int | None = None,
    max_active: int | None = DEFAULT_MAX_ACTIVE,
    progress: Callable[[int, int], None] | None = None,
    preemption: str = "step",
    decode: str = "inline",
    decode_share: float = 0.5,
    late_share: float = LATE_SHARE,
    noise: TimingNoise | None = None,
) -> SimResult:
    """Replay ``requests`` (any order; arrival times absolute) under ``policy``.

    The device's true timings come from ``cost`` (default: a fresh, uncorrected cost model of
    the policy's profile), each duration — step, chunk, encode, decode, transfer — drawn by
    ``noise`` around it (``TimingNoise``; None: exact, the truth is the profile itself). The
    policy learns the device only through what it observes, and sees only arrived requests,
    at decision points between iterations. Every request runs to completion (``page_bytes``
    default: the profile's page size). At most ``max_active`` requests are started at once
    (None: no cap);
    ``device_pages`` overrides the page count the profile leaves for request state.
    ``progress(done, total)`` is called as requests finish. ``preemption="block"`` runs
    steps in chunks of transformer blocks (``ditmem.scheduler.block_step``): at a chunk
    boundary after which a request has arrived the policy decides again and may park the
    part-done step; with no arrival the step continues (the engine only checks its intake).
    ``decode="tiled"`` runs decodes tile by tile on the loop, a tile instead of the plan
    whenever the earliest pending decode is due before every member of the planned batch,
    and a late decode's tile once it has earned about ``late_share`` of the loop
    (``decode_lane.TiledDecodes``; 0: only when no step is planned) or when it fits in the
    time the plan grants late decodes (``StepPlan.late_tiles_s``).
    ``decode="concurrent"`` models a decode worker beside the step loop on the same device
    (:mod:`ditmem.scheduler.decode_lane`) that gets ``decode_share`` of the device while
    both have work; a request holds its pages until its decode ends.
    """
    if preemption not in PREEMPTION_MODES:
        raise ValueError(f"preemption must be one of {PREEMPTION_MODES}, got {preemption!r}")
    if decode not in DECODE_MODES:
        raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
    truth = cost if cost is not None else CostModel(policy.cost.profile)
    noise = noise if noise is not None else TimingNoise(sigma=0.0)
    if not requests:
        return SimResult([], 0.0, 0, 0.0)
    pending = arrivals(requests, policy.cost, slo_scale, "simulate() runs")
    page_bytes = truth.page_bytes if page_bytes is None else page_bytes
    eng = _Engine(
        truth, pending[0].model, page_bytes, device_pages, max_active, preemption, noise,
        policy.chunk_blocks, decode == "inline",
    )
    records: list[Record] = []
    now, nxt, iterations, busy, idle_moves = 0.0, 0, 0, 0.0, 0
    last_batch: tuple[str, ...] = ()
    batch_sizes: dict[int, int] = {}
    total, chunks, overhead_total = len(pending), 0, 0.0
    block = preemption == "block"
    lane = DecodeLane(decode_share) if decode == "concurrent" else None
    tiles = TiledDecodes(late_share) if decode == "tiled" else None
    decoding: dict[str, RequestStatus] = {}
    first_s: dict[str, float] = {}  # seconds run so far of each first-going tiled decode
    carried: list[Request] = []  # first-going decodes done since the last step's report
    carried_s = 0.0

    def record(s: RequestStatus, at: float) -> None:
        eng.free += s.pages
        records.append(Record(s.request, s.started_at, at, s.preemptions,
                              eng.offloads.get(s.id, 0), eng.parks.get(s.id, 0)))

    while len(records) < total:
        arrived = False
        while nxt < total and pending[nxt].arrival <= now:
            eng.waiting.push(pending[nxt])
            nxt += 1
            arrived = True
        if block:
            eng.parking.settle(now, eng)
        if block and not arrived and _running_part_done(eng, last_batch):
            # Between arrivals the policy's answer at a preemption point is "continue" (only
            # an arrival can ask for the device), so the engine only checks its intake.
            plan = StepPlan(batch=list(last_batch))
        else:
            decodes = () if tiles is None else tuple(
                PendingDecode(decoding[rid].request, left, n) for rid, left, n in tiles.pending())
            plan = policy.schedule(now, eng.view(last_batch, decodes))
        pick = None
        if (tiles is not None and not plan.hold_tiles
                and not (block and _running_part_done(eng, last_batch))):
            pick = tiles.pick(now, step_deadline(now, _deadlines(eng, plan)), plan.late_tiles_s,
                              plan.yield_s)
        if pick is not None:
            # A due decode runs one tile instead of the plan; the policy decides again after.
            seconds, last = tiles.run_one(pick)
            now += seconds
            busy += seconds
            if pick in first_s:
                first_s[pick] += seconds
            if last:
                if pick in first_s:  # reported with the next step (the policy learns from it)
                    carried.append(decoding[pick].request)
                    carried_s += first_s.pop(pick)
                record(decoding.pop(pick), now)
                if progress is not None:
                    progress(len(records), total)
            last_batch = ()
            continue
        if plan.idle and lane is not None and len(lane):
            # Only the decode worker has work: it runs alone until an arrival or until its
            # next decode ends (which frees pages), whichever is first.
            now, done = lane.run_until(now, pending[nxt].arrival if nxt < total else None)
            for rid, at in done:
                record(decoding.pop(rid), at)
            if done and progress is not None:
                progress(len(records), total)
            last_batch = ()
            continue
        if plan.idle:
            if nxt >= total:
                raise PlanError(
                    f"policy {policy.name!r} stalled at t={now:.3f}s with "
                    f"{len(eng.waiting)} waiting and {len(eng.active)} active requests"
                )
            now = max(now, pending[nxt].arrival)
            last_batch = ()
            continue
        idle_moves = 0 if plan.batch else idle_moves + 1
        if idle_moves > MAX_MOVES_WITHOUT_STEP:
            raise PlanError(
                f"policy {policy.name!r} moved memory {idle_moves} times in a row without "
                f"running a step (t={now:.3f}s)"
            )
        if plan.blocks is not None and not block:
            raise PlanError("plan.blocks is only allowed with block-level preemption")
        it = eng.it = _Iteration(now, [], [])  # what this iteration's stages measure
        run_stages(eng, offload=plan.offload, restore=plan.restore, admit=plan.admit,
                   batch=plan.batch, blocks=plan.blocks)
        pre, step, overhead, decode = it.transfer_s, it.step_s, it.overhead_s, it.decode_s
        encode, encoded, members, model = it.encode_s, it.encoded, it.members, it.model
        tokens, blocks_run, finished, moved = it.tokens, it.blocks, it.finished, it.moved
        chunks += 1 if block and members else 0
        if last_batch:
            for rid in preempted(last_batch, plan.batch, eng.active):
                eng.active[rid].preemptions += 1
        duration = pre + encode + step + overhead + decode
        overhead_total += overhead
        decoded: list[tuple[str, float]] = []
        if lane is None:
            now += duration
        else:
            now, decoded = lane.share(now, duration)
        busy += duration
        iterations += 1
        batch_sizes[len(members)] = batch_sizes.get(len(members), 0) + 1
        for rid, at in decoded:
            record(decoding.pop(rid), at)
        for s in finished:
            del eng.active[s.id]
            if lane is None and tiles is None:
                record(s, now)
                continue
            decoding[s.id] = s
            cls = shape_class(s.request)
            if lane is not None:
                lane.push(s.id, s.request.deadline,
                          noise.draw(truth.decode_time(s.request), "decode", cls))
            else:
                pieces = [noise.draw(t, "decode", cls) for t in truth.decode_tiles(s.request)]
                first = s.id in plan.first_decodes  # its tiles go first (StepPlan)
                tiles.push(s.id, s.request.deadline, pieces, first=first)
                if first:
                    first_s[s.id] = 0.0
        if progress is not None and (decoded or (finished and lane is None and tiles is None)):
            progress(len(records), total)
        last_batch = tuple(plan.batch)
        policy.observe(
            StepReport(
                now,
                list(plan.batch),
                model,
                tokens,
                step,
                encode,
                decode + carried_s,
                pre,
                [s.id for s in finished],
                blocks_run,
                encoded,
                [s.request for s in finished] if lane is None and tiles is None else carried,
                0.0 if block else moved * page_bytes,
            )
        )
        carried, carried_s = [], 0.0
    records.sort(key=lambda rec: (rec.request.arrival, rec.request.id))
    parks = sum(eng.parks.values())
    return SimResult(
        records, now, iterations, busy, batch_sizes, chunks, parks, eng.link.busy_s, overhead_total
    )


def arrivals(
    requests: Sequence[Request], cost: CostModel, slo_scale: float, runner: str
) -> list[Request]:
    """``requests`` in arrival order (ties by id), each without a deadline given
    ``slo_scale`` × its standalone time by ``cost``. ValueError (``runner`` names who
    refuses) when they are not all of one model."""
    models = {r.model for r in requests}
    if len(models) != 1:
        raise ValueError(f"{runner} one model, got {sorted(models)}")
    pending = sorted(requests, key=lambda r: (r.arrival, r.id))
    for r in pending:
        if r.deadline is None or r.standalone_s is None:
            cost.assign_deadline(r, slo_scale)
    return pending


def _deadlines(eng: _Engine, plan: StepPlan) -> list[float]:
    """The deadlines of the plan's batch, members it admits included (empty: no step)."""
    return [
        eng.active[rid].request.deadline if rid in eng.active else eng.waiting.get(rid).deadline
        for rid in plan.batch
        if rid in eng.active or rid in eng.waiting
    ]


def _running_part_done(eng: _Engine, last_batch: tuple[str, ...]) -> bool:
    """Whether the last iteration ran a step that is still part-done (``loop.mid_step``)."""
    return mid_step([eng.active.get(rid) for rid in last_batch])


def _step_key(members: list[RequestStatus]) -> str:
    """A step's class for the timing noise: its largest member's shape (``step_class``)."""
    return step_class(s.request for s in members) if members else ""


def _check_batch(members: list[RequestStatus], cost: CostModel) -> str:
    if not members:
        return ""
    model = members[0].request.model
    ids = [s.id for s in members]
    if len(set(ids)) != len(ids):
        raise PlanError(f"batch {ids} repeats a request")
    for s in members:
        if s.request.model != model:
            raise PlanError(f"batch mixes models {model!r} and {s.request.model!r}")
        if s.location is not Location.DEVICE:
            raise PlanError(f"batch member {s.id!r} is on the host (restore it first)")
    if len(members) > cost.max_batch(model):
        raise PlanError(f"batch of {len(members)} exceeds max_batch {cost.max_batch(model)}")
    return model
