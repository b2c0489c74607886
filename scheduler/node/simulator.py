"""The node loop: arrivals → decision → jobs on groups → completions, over ``NodeDevices``.

``run_node`` is written against the device interface only (``ditmem.scheduler.node.device``),
so the node engine can drive real devices with it; ``simulate_node`` runs it on
``VirtualDevices`` (durations drawn around the profile with ``TimingNoise``). Each job's
order is the single-device loop's, by the same function (``node.device.run_job`` calls
``ditmem.scheduler.loop.run_stages``): offload → restore/migrate → admit/encode → step(s) →
decode. Between the tiles of a split decode the loop asks ``policy.take_back`` whether to
take a spare device back (``NodeDevices.reclaim``). The loop keeps the numbers a policy
sees (free devices, pages per device, host pages) and checks every plan: a broken rule
raises ``PlanError`` naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..noise import TimingNoise
from ..queue import WaitingQueue
from ..request import Request
from ..simulator import PlanError, Record
from .cost import NodeCost, busy_until, move_mask
from .device import (
    Completion,
    Job,
    Move,
    NodeDevices,
    VirtualDevices,
    decode_devices,
    decode_ends,
    decode_lanes,
    split_ends,
)
from .intake import NodeIntake, TraceIntake
from .plan import Assignment, NodeStatus, NodeView, SpareDevice
from .topology import Group, Node

log = logging.getLogger(__name__)

#: Most started (running + paused) requests per device (DESIGN.md: 64).
MAX_STARTED_PER_DEVICE = 64


@dataclass(slots=True)
class NodeReport:
    """What one finished job measured (fed to ``policy.observe``)."""

    now: float
    group: Group
    batch: list[str]
    model: str
    tokens: list[int]
    steps: int
    transfer_s: float
    encode_s: float
    step_s: float
    decode_s: float
    finished: list[str] = field(default_factory=list)
    wait_s: float = 0.0
    #: (kind, predicted s, measured s) per move the devices timed (``NodeCost.observe_move``).
    moves: list[tuple[str, float, float]] = field(default_factory=list)
    #: (request, devices, measured s) per decode the devices measured whole
    #: (``Timings.decodes``; ``NodeCost.observe_decode``).
    decodes: list[tuple[Request, int, float]] = field(default_factory=list)
    #: the requests whose encodes ``encode_s`` measured (``NodeCost.observe_encode``)
    encoded: list[Request] = field(default_factory=list)


@dataclass(slots=True)
class NodeResult:
    records: list[Record]
    makespan: float
    jobs: int
    device_busy_s: float
    decisions: int
    link_busy_s: float = 0.0


@dataclass(slots=True)
class _SplitPlan:
    """A split decode as the loop predicts it (the policy's model): its job, request,
    devices (lane first), each device's tile seconds, the blend, when its job's steps
    ended (None until then) and the spares taken back (position → s after that)."""

    job: Job
    request: Request
    devices: tuple[int, ...]
    tiles: list[list[float]]
    blend: float
    stepped: float | None = None
    taken: dict[int, float] = field(default_factory=dict)

    def spare(self, device: int, now: float) -> SpareDevice:
        """What the policy sees of spare ``device`` at ``now`` (after the steps)."""
        t0, pos = self.stepped, self.devices.index(device)
        end, ends = split_ends(self.tiles, self.blend, self.taken)
        taken = dict(self.taken)
        taken[pos] = max(0.0, now - t0)
        end2, ends2 = split_ends(self.tiles, self.blend, taken)
        return SpareDevice(device, self.job.job_id, self.request, self.devices[0],
                           t0 + ends[pos], t0 + ends2[pos], t0 + end, t0 + end2)


@dataclass(slots=True)
class _Running:
    """A launched job until its last event: its members, the devices it still holds, the
    device each of its decodes runs on, and what it finished."""

    members: list[NodeStatus]
    held: int
    lanes: dict[str, int]
    stepped: bool = False
    finished: list[str] = field(default_factory=list)


class _State:
    """The loop's bookkeeping: who is where, free devices and pages."""

    def __init__(self, node: Node, truth: NodeCost, model: str, page_bytes: int, cap):
        self.node = node
        self.truth = truth
        self.page_bytes = page_bytes
        self.free = node.all_mask
        per_device = truth.cost.device_pages(model, page_bytes)
        self.free_pages = [per_device] * node.devices
        self.host_free = truth.cost.host_pages(page_bytes)
        self.waiting = WaitingQueue()
        self.started: dict[str, NodeStatus] = {}
        self.running: dict[int, _Running] = {}
        self.max_started = cap
        # Predicted end of each device's job, and of moves of other jobs reading from it.
        self.job_ends = [0.0] * node.devices
        self.sends = [0.0] * node.devices
        #: spare device of a split decode → its decode's plan (until the device is back)
        self.spares: dict[int, _SplitPlan] = {}

    @property
    def busy(self) -> list[float]:
        return [max(a, b) for a, b in zip(self.job_ends, self.sends, strict=True)]

    def view(self, now: float) -> NodeView:
        paused, running = [], []
        for s in self.started.values():
            (running if s.running else paused).append(s)
        return NodeView(
            now, self.node, self.free, paused, running, self.waiting, list(self.free_pages),
            self.host_free, self.page_bytes, self.max_started, self.busy,
        )

    def place(self, s: NodeStatus, group: Group | None) -> None:
        """Move ``s``'s page accounting to ``group`` (None: the host pool)."""
        total_pages = s.pages * (s.group.degree if s.group is not None else 0)
        if s.group is not None:
            for dev in s.group.devices:
                self.free_pages[dev] += s.pages
        else:
            self.host_free += s.host_pages
            s.host_pages = 0
        if group is None:
            if self.host_free < total_pages:
                raise PlanError(f"offload of {s.id!r}: host pool full ({self.host_free} pages)")
            self.host_free -= total_pages
            s.group, s.host_pages = None, total_pages
            return
        pages = self.truth.shard_pages(s.request, group.degree, self.page_bytes)
        short = [d for d in group.devices if self.free_pages[d] < pages]
        if short:
            raise PlanError(
                f"{s.id!r} on group {group}: needs {pages} pages per device, device {short[0]} "
                f"has {self.free_pages[short[0]]}"
            )
        for dev in group.devices:
            self.free_pages[dev] -= pages
        s.group, s.pages = group, pages


def run_node(
    requests: Sequence[Request] | NodeIntake,
    policy,
    devices: NodeDevices,
    node: Node,
    truth: NodeCost,
    *,
    slo_scale: float = 3.0,
    page_bytes: int | None = None,
    max_started_per_device: int | None = MAX_STARTED_PER_DEVICE,
    progress: Callable[[int, int], None] | None = None,
    on_record: Callable[[Record], None] | None = None,
) -> NodeResult:
    """Run ``requests`` (a trace, or a ``NodeIntake`` a live server feeds) on ``node``
    under ``policy`` (a node policy) with ``devices``, until the intake is closed and
    every request it gave has finished or been cancelled.

    Requests of a trace without a deadline get ``slo_scale`` × their standalone time at
    degree 1. At most ``max_started_per_device`` × D requests are started at once (None:
    no cap). ``on_record``: called with each finished request's record, which is then not
    kept (a server's loop runs for its lifetime); else records are returned.
    """
    if isinstance(requests, Sequence):
        if not requests:
            return NodeResult([], 0.0, 0, 0.0, 0)
        requests = TraceIntake(requests, truth.cost, slo_scale)
    intake = requests
    page_bytes = truth.cost.page_bytes if page_bytes is None else page_bytes
    cap = None if max_started_per_device is None else max_started_per_device * node.devices
    st = _State(node, truth, intake.model, page_bytes, cap)
    records: list[Record] = []
    finished_count, now, jobs, decisions, busy = 0, 0.0, 0, 0, 0.0
    total = len(intake.pending) if isinstance(intake, TraceIntake) else 0
    cancelling: set[str] = set()
    lost = 0
    changed = True
    # the policy's choice, per job (a policy object need not derive from NodePolicy)
    split_decode = getattr(policy, "split_decode", None)
    take_back = getattr(policy, "take_back", None)
    policy_yields = take_back is not None and bool(getattr(policy, "split_yield", False))

    def reclaim(now: float) -> None:
        """Ask the policy which spares of split decodes to take back now; tell the devices
        and move the loop's predictions (the spare's end, the lane's, its request's)."""
        spares = [sp.spare(d, now) for d, sp in st.spares.items()
                  if sp.stepped is not None and sp.devices.index(d) not in sp.taken]
        if not spares:
            return
        view = st.view(now)
        view.spares = spares
        by_device = {x.device: x for x in spares}
        for d in take_back(view):
            x = by_device.get(d)
            if x is None:
                raise PlanError(f"take_back: device {d} is no spare of a split decode")
            sp = st.spares[d]
            sp.taken[sp.devices.index(d)] = max(0.0, now - sp.stepped)
            devices.reclaim(sp.job, d, now)
            st.job_ends[d] = min(st.job_ends[d], x.taken_free_at)
            st.job_ends[x.lane] = max(st.job_ends[x.lane], x.taken_decode_end)
            s = st.started.get(sp.request.id)
            if s is not None:
                s.job_end = max(s.job_end, x.taken_decode_end)

    def launch(a: Assignment, split: bool) -> None:
        nonlocal jobs
        g = a.group
        if g.mask & st.free != g.mask:
            raise PlanError(f"group {g} is not free")
        if a.steps < 1:
            raise PlanError(f"assignment on {g}: steps must be >= 1, got {a.steps}")
        moves: list[Move] = []
        for rid in a.offload:
            s = st.started.get(rid)
            if s is None or s.running or s.group is None or not s.group.mask & g.mask:
                raise PlanError(f"offload of {rid!r}: not a paused request resident on {g}")
            moves.append(Move(s.request, s.group, None))
            st.place(s, None)
            s.offloads += 1
        members, encodes = [], []
        for rid in a.batch:
            s = st.started.get(rid)
            if s is not None:
                if s.running:
                    raise PlanError(f"{rid!r} is already running")
                if s.group != g:
                    moves.append(Move(s.request, s.group, g))
                    s.migrations += s.group is not None
                    st.place(s, g)
            elif rid in st.waiting:
                if st.max_started is not None and len(st.started) >= st.max_started:
                    raise PlanError(f"admit of {rid!r}: {st.max_started} requests already started")
                s = NodeStatus(st.waiting.remove(rid), started_at=now)
                st.started[rid] = s
                st.place(s, g)
                encodes.append(s.request)
            else:
                raise PlanError(f"{rid!r}: neither started nor waiting")
            members.append(s)
        if len({s.id for s in members}) != len(members):
            raise PlanError(f"batch {a.batch} repeats a request")
        model = members[0].request.model if members else ""
        if members and len(members) > truth.cost.max_batch(model):
            raise PlanError(f"batch of {len(members)} exceeds max_batch")
        if any(s.steps_left < a.steps for s in members):
            raise PlanError(f"assignment on {g}: {a.steps} steps exceed a member's steps left")
        decodes = [s.request for s in members if s.steps_left == a.steps]
        job = Job(jobs, g, [s.request for s in members], a.steps if members else 0,
                  moves, encodes, decodes, split)
        stepped, device_ends, decode_ends, sends = _predict(policy.ncost, job, st.busy, now)
        for d, until in sends.items():
            st.sends[d] = max(st.sends[d], until)
        for d in g.devices:
            st.job_ends[d] = device_ends[d]
        ends = {r.id: e for r, e in zip(decodes, decode_ends, strict=True)}
        for s in members:
            if s.steps_done > 0 and now > s.last_end + 1e-9:
                s.preemptions += 1
            s.running, s.job_end = True, ends.get(s.id, stepped)
        devices.launch(job, now)
        if split and policy_yields:
            for r, ds in zip(decodes, decode_devices(g, len(decodes), True), strict=True):
                if len(ds) > 1:
                    tiles, blend = policy.ncost.decode_tile_parts(r, len(ds))
                    sp = _SplitPlan(job, r, ds, tiles, blend)
                    for d in ds[1:len(tiles)]:
                        st.spares[d] = sp
        lanes = decode_lanes(g, len(decodes))
        st.running[job.job_id] = _Running(
            members, g.mask, {r.id: d for r, d in zip(decodes, lanes, strict=True)})
        st.free &= ~g.mask
        jobs += 1

    def on_stepped(run: _Running, job: Job, t: float) -> None:
        """``job``'s steps ended at ``t``: members that do not decode are paused; a
        decoding one is now on its decode's device alone (its pages too)."""
        run.stepped = True
        for sp in st.spares.values():
            if sp.job is job:
                sp.stepped = t
        degree = job.group.degree
        for s in run.members:
            s.degrees[degree] = s.degrees.get(degree, 0) + job.steps
            s.last_end = t
            lane = run.lanes.get(s.id)
            if lane is None:
                s.running = False
                s.steps_done += job.steps
            elif s.group is not None and s.group.degree > 1:
                need = truth.shard_pages(s.request, 1, page_bytes) - s.pages
                if st.free_pages[lane] >= need:
                    st.place(s, node.group_of(lane, 1))
                else:  # the devices' gather fails too (the node engine fails the request)
                    log.warning("decode of %s: device %d lacks %d pages to gather it; kept "
                                "on group %s", s.id, lane, need - st.free_pages[lane], s.group)

    def on_decoded(run: _Running, job: Job, rid: str, t: float) -> None:
        """``rid``'s decode ended at ``t``: it is done, its pages are free."""
        nonlocal finished_count
        s = st.started.pop(rid)
        s.running = False
        s.steps_done += job.steps
        s.last_end = t
        for dev in s.group.devices:
            st.free_pages[dev] += s.pages
        run.finished.append(rid)
        finished_count += 1
        record = Record(s.request, s.started_at, t, s.preemptions, s.offloads,
                        migrations=s.migrations, degrees=dict(s.degrees))
        if on_record is not None:
            on_record(record)
        else:
            records.append(record)

    def complete(c: Completion) -> None:
        nonlocal busy
        job = c.job
        run = st.running[job.job_id]
        if (c.stepped or c.last) and not run.stepped:
            on_stepped(run, job, c.finished)
        decoded = list(c.decoded)
        if c.last:  # a job reported at once (or cut short): the rest ends here
            decoded += [rid for rid in run.lanes if rid not in run.finished
                        and rid not in decoded]
        count = finished_count
        for rid in decoded:
            on_decoded(run, job, rid, c.finished)
        release = run.held if c.last else sum(1 << d for d in c.released) & run.held
        run.held &= ~release
        st.free |= release & ~lost
        for d in [d for d, sp in st.spares.items() if release >> d & 1 and sp.job is job]:
            del st.spares[d]
        for d in job.group.devices:
            if release >> d & 1:  # its work in the job is over, whatever was predicted
                st.job_ends[d] = min(st.job_ends[d], c.finished)
                busy += c.finished - c.started
        if finished_count > count and progress is not None:
            progress(finished_count, total)
        if not c.last:
            return
        del st.running[job.job_id]
        model = job.batch[0].model if job.batch else ""
        t = c.timings
        moves = [
            (mv.kind, mv.predicted_s, secs)
            for mv, secs in zip(job.moves, t.move_s, strict=False)
        ]
        by_id = {r.id: r for r in job.decodes}
        decoded = [(by_id[rid], n, secs) for rid, n, secs in t.decodes if rid in by_id]
        policy.observe(
            NodeReport(c.finished, job.group, [r.id for r in job.batch], model,
                       [truth.cost.tokens(r) for r in job.batch], job.steps, t.transfer_s,
                       t.encode_s, t.step_s, t.decode_s, list(run.finished), t.wait_s, moves,
                       decoded, list(job.encodes))
        )

    def drop(rid: str) -> bool:
        """Let a cancelled request go; False while a job runs it (tried again later)."""
        if rid in st.waiting:
            st.waiting.remove(rid)
            policy.forget(rid)
            intake.dropped(rid, False)
            return True
        s = st.started.get(rid)
        if s is None:  # finished (or never arrived)
            return True
        if s.running:
            return False
        if s.group is not None:
            for dev in s.group.devices:
                st.free_pages[dev] += s.pages
        else:
            st.host_free += s.host_pages
        del st.started[rid]
        policy.forget(rid)
        intake.dropped(rid, True)
        return True

    while True:
        for r in intake.take(now):
            st.waiting.push(r)
            now = max(now, r.arrival)  # live: it came while the loop was busy
            changed = True
        cancelling.update(intake.cancelled())
        for rid in [rid for rid in cancelling if drop(rid)]:
            cancelling.discard(rid)
            changed = True
        newly_lost = intake.lost() & ~lost
        if newly_lost:
            lost |= newly_lost
            st.free &= ~lost
            changed = True
        if intake.closed() and not st.waiting and not st.started and not st.running:
            break
        if changed and policy_yields and st.spares and (
            st.waiting or any(not s.running for s in st.started.values())
        ):
            reclaim(now)
        if changed and st.free and (
            st.waiting or any(not s.running for s in st.started.values())
        ):
            view = st.view(now)
            plan = policy.schedule(view)
            decisions += 1
            for a in plan.assignments:
                launch(a, bool(split_decode(view, plan, a)) if split_decode else False)
        changed = False
        until = intake.next_arrival()
        if not st.running and until is None and intake.closed():
            raise PlanError(
                f"policy {policy.name!r} stalled at t={now:.3f}s with {len(st.waiting)} waiting "
                f"and {len(st.started)} started requests"
            )
        done = devices.wait(until)
        if not done:
            now = until if until is not None else max(now, intake.now())
            continue
        now = done[0].finished
        for c in done:
            complete(c)
        changed = True
    records.sort(key=lambda r: (r.request.arrival, r.request.id))
    return NodeResult(records, now, jobs, busy, decisions, getattr(devices, "link_busy_s", 0.0))


def _predict(
    ncost: NodeCost, job: Job, busy: list[float], now: float
) -> tuple[float, dict[int, float], list[float], dict[int, float]]:
    """When the policy's model says ``job``, launched at ``now``, ends its last step;
    when each of its devices is done with it (its decodes after that step, on their
    ``decode_devices``: a lane each, or split over the spare devices); when each decode
    ends (``job.decodes`` order); until when
    its moves read from devices outside its group (the job's stages begin
    ``links.job_latency_s`` after its devices are free, as ``VirtualDevices`` pays it).
    Each move's ``kind`` and
    ``predicted_s`` are set. ``busy`` (per device, when its current work ends as
    predicted) gives the waits: the job's group still sending another job's move, a
    move's source still running a job."""
    from .device import spread

    clock = busy_until(job.group.mask, busy, now) + ncost.links.job_latency_s
    sends: dict[int, float] = {}
    for mv in job.moves:
        if mv.dst is None:
            mv.kind, mv.predicted_s = "offload", ncost.offload_time(mv.request, mv.src)
        else:
            mv.predicted_s, mv.kind = ncost.move_time(mv.request, mv.src, mv.dst)
        mask = move_mask(mv.src, mv.dst)
        clock = max(clock, busy_until(mask, busy, clock)) + mv.predicted_s
        outside = mask & ~job.group.mask
        for d in range(len(busy)):
            if outside >> d & 1:
                sends[d] = clock
    cost = ncost.cost
    clock += spread([ncost.encode_time(r) for r in job.encodes], job.group.degree)
    if job.batch:
        tokens = [cost.tokens(r) for r in job.batch]
        clock += job.steps * ncost.step_time(job.batch[0].model, tokens, job.group.degree)
    sets = decode_devices(job.group, len(job.decodes), job.split_decodes)
    parts = [ncost.decode_parts(r, len(ds)) for r, ds in zip(job.decodes, sets, strict=True)]
    decodes, devices = decode_ends(job.group, parts, job.split_decodes)
    return (clock, {d: clock + e for d, e in devices.items()}, [clock + e for e in decodes],
            sends)


def simulate_node(
    requests: Sequence[Request],
    policy,
    node: Node,
    *,
    noise: TimingNoise | None = None,
    truth: NodeCost | None = None,
    **kwargs,
) -> NodeResult:
    """``run_node`` on ``VirtualDevices``: true durations drawn around ``truth`` (default: a
    fresh NodeCost on the policy's profile, never the policy's learning copy) with
    ``noise`` (default: none)."""
    truth = truth if truth is not None else NodeCost(policy.ncost.cost, policy.ncost.parallel)
    devices = VirtualDevices(truth, noise, node.devices)
    return run_node(requests, policy, devices, node, truth, **kwargs)
