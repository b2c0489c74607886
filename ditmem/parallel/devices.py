"""The node engine behind the scheduler's device interface: real devices for
``ditmem.scheduler.node.simulator.run_node``.

``run_node`` decides (policy, page accounting, plan checks) and hands each group a
``Job``; :class:`EngineDevices` runs it on the :class:`~ditmem.parallel.node.NodeEngine`'s
workers in a thread of its own (jobs on disjoint groups run at once) in the loop's order:
moves (park on the host, restore from it onto any group, re-shard between groups over the
device link), encodes (single-device, spread round-robin over the group, then re-sharded
onto the whole group), ``steps`` packed steps at the group's degree, decodes (each on its
``decode_lanes`` device; after the last step every decoding request is gathered onto its
device, then the devices without a decode go back to the loop at once and each request as
its decode ends: partial ``Completion`` events; with ``Job.split_decodes`` and fewer
decodes than devices, each decode's tiles spread over its ``decode_devices``, blended on its
lane: ``NodeEngine.decode_split``; each spare device back as its own tiles end, or between
two of them when the loop takes it back: :meth:`EngineDevices.reclaim`). Each decode's
seconds go back in ``Timings.decodes`` (the policy's decode-time learning). ``wait`` hands
completions back in wall time
since the start, so the
same loop that drives the simulator's virtual devices replays a trace in real time.

A job that fails (a lost device, a pool without room) still completes, so the loop never
waits forever; its error is recorded in :attr:`EngineDevices.errors`, its requests in
:attr:`EngineDevices.failed` (and handed to ``on_failed``), and their pages are released;
once its steps are over only the requests still to decode fail, and a request whose
gather onto its decode device fails fails alone.
Members that already failed (their device was lost while they were paused) are left out
of a job, so they cannot fail the others. :meth:`EngineDevices.notify` makes ``wait``
return early (a live arrival, a cancel): the loop then reads the time from its intake.
Each move is timed (:class:`~ditmem.parallel.node.MoveTiming`, kept in
:attr:`EngineDevices.moves`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ditmem.scheduler.node.device import (
    Completion,
    Job,
    JobStages,
    Timings,
    decode_devices,
    decode_lanes,
    run_job,
)

log = logging.getLogger(__name__)


def _spread(items: list, devices: tuple[int, ...], fn: Callable) -> None:
    """``fn(item, device)`` for every item, round-robin over ``devices``, one thread per
    device (items on one device run in order)."""
    _in_lanes({d: items[i::len(devices)] for i, d in enumerate(devices)}, fn)


def _in_lanes(lanes: dict[int, list], fn: Callable) -> None:
    """``fn(item, device)`` for each device's items, one thread per device (its items in
    order); the first error is raised once every thread has ended."""
    errors: list[BaseException] = []

    def lane(d: int) -> None:
        try:
            for item in lanes[d]:
                fn(item, d)
        except BaseException as exc:  # re-raised below, in the job's thread
            errors.append(exc)

    threads = [threading.Thread(target=lane, args=(d,)) for d in lanes if lanes[d]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class _Woken:
    """Put on the completion queue by :meth:`EngineDevices.notify` (not a completion)."""


@dataclass(slots=True)
class MoveRecord:
    """A timed move command: ``kind`` ("offload", "restore", "peer"; "host-park" and
    "host-restore" for a move between groups through the host), the request, and its
    ``MoveTiming``."""

    kind: str
    request_id: str
    timing: object


#: moves kept in ``EngineDevices.moves`` (the latest ones)
MOVES_KEPT = 10_000


class EngineDevices:
    """``NodeDevices`` on a ``NodeEngine`` (see module docstring).

    to_generation: scheduler ``Request`` -> ``GenerationRequest`` (its ``request_id`` must
    be the request's id); keep_outputs: keep every decoded image in :attr:`outputs`;
    decode_tile: ``(tile_px, stride_px)`` to decode with the VAE's tiled decode (as the
    profile's ``decode_tile_*`` prices it), ``None`` for whole decodes. A server's
    callbacks (from job threads): ``on_output(request_id, image)`` as each image is decoded
    (uint8 ``[H, W, 3]``), ``on_failed(request_id, error)`` for each request of a failed
    job (or left out of one), ``on_event(kind, request_ids, seconds)`` as stages end: kind
    "encoded" (per request), "stepped" (one packed step of them all), "decoded" (per
    request) or "moved" (one request's state parked, restored or re-sharded), with the
    stage's wall seconds (a move's: its own, without the wait for busy devices).
    """

    def __init__(self, node, to_generation: Callable, *, keep_outputs: bool = False,
                 decode_tile: tuple[int, int] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_output: Callable[[str, object], None] | None = None,
                 on_failed: Callable[[str, BaseException], None] | None = None,
                 on_event: Callable[[str, list[str], float], None] | None = None) -> None:
        self.node = node
        self.decode_tile = decode_tile
        self.to_generation = to_generation
        self.keep_outputs = keep_outputs
        self.clock = clock
        self.t0 = clock()
        self.outputs: dict[str, object] = {}
        self.errors: list[str] = []
        self.failed: set[str] = set()
        self.link_busy_s = 0.0
        self.on_output, self.on_failed, self.on_event = on_output, on_failed, on_event
        self.moves: deque[MoveRecord] = deque(maxlen=MOVES_KEPT)
        self._done: queue.Queue[Completion | _Woken] = queue.Queue()
        self._lock = threading.Lock()
        #: running job id → the spare devices of its split decodes the loop took back
        #: (``reclaim``); an entry from ``launch`` to the job's end
        self._taken: dict[int, set[int]] = {}
        #: request id → the event its latest launched move sets when done (``_MoveOrder``)
        self._moving: dict[str, threading.Event] = {}

    def now(self) -> float:
        """Seconds since the devices were created (the loop's time axis)."""
        return self.clock() - self.t0

    def launch(self, job: Job, now: float) -> None:
        """Run ``job`` on its own thread. Its moves of a request start only after that
        request's moves in the jobs launched before it have ended (``_MoveOrder``): the
        loop may offload a paused request in one job and restore it elsewhere in the
        next, and the two jobs' threads run at once."""
        with self._lock:
            self._taken[job.job_id] = set()
            order = _MoveOrder(self._moving, self._lock, [m.request.id for m in job.moves])
        threading.Thread(target=self._run, args=(job, now, order),
                         name=f"ditmem-job-{job.job_id}", daemon=True).start()

    def reclaim(self, job: Job, device: int, now: float) -> None:
        """``NodeDevices.reclaim``: ``device``, a spare of ``job``'s split decode, stops
        before its next tile (the one it runs ends first) and goes back to the loop; its
        tiles left run on the decode's lane (``NodeEngine.decode_split``'s ``taken``). A job
        that has ended (the loop has not seen its last events yet): nothing is kept."""
        with self._lock:
            taken = self._taken.get(job.job_id)
            if taken is not None:
                taken.add(device)

    def _is_taken(self, job_id: int, device: int) -> bool:
        with self._lock:
            return device in self._taken.get(job_id, ())

    def notify(self) -> None:
        """Make the loop's current (or next) ``wait`` return early, with no completion."""
        self._done.put(_Woken())

    def wait(self, until: float | None) -> list[Completion]:
        timeout = None if until is None else max(0.0, until - self.now())
        try:
            first = self._done.get(timeout=timeout)
        except queue.Empty:
            return []
        return [] if isinstance(first, _Woken) else [first]

    # ------------------------------------------------------------------ one job
    def _run(self, job: Job, started: float, order: _MoveOrder) -> None:
        t = Timings()
        # what a failure of this job fails: its batch until its steps end, then the
        # requests still to decode (the others are back with the loop by then)
        owned = [r.id for r in job.batch]
        try:
            self._execute(job, started, t, owned, order)
        except Exception as exc:  # the loop must see the job end; the error is kept
            msg = f"job {job.job_id} on group {job.group}: {type(exc).__name__}: {exc}"
            log.error(msg)
            with self._lock:
                rids = [rid for rid in owned if rid not in self.failed]
            self._fail(rids, exc, msg)
        finally:
            order.end()  # moves it never reached must not hold later jobs' moves
        with self._lock:
            self._taken.pop(job.job_id, None)
        self._done.put(Completion(job, started, self.now(), t))

    def _fail(self, rids: list[str], exc: BaseException, msg: str) -> None:
        """Record ``rids`` failed with ``exc`` (pages released where their devices live)."""
        with self._lock:
            self.errors.append(msg)
            self.failed.update(rids)
        for rid in rids:  # a failed request holds no pages (later jobs fail fast)
            try:
                self.node.release(rid)
            except Exception as cleanup:  # a lost device: nothing to free there
                log.debug("release of %s after a failed job: %s", rid, cleanup)
            if self.on_failed is not None:
                self.on_failed(rid, exc)

    def _execute(self, job: Job, started: float, t: Timings, owned: list[str],
                 order: _MoveOrder) -> None:
        # each decode's device as the loop assigned it (its lanes of the job it launched)
        lanes = dict(zip([r.id for r in job.decodes],
                         decode_lanes(job.group, len(job.decodes)), strict=True))
        with self._lock:
            failed = set(self.failed)
        # lost with a device while paused, or failed in an earlier job (told once): leave
        # them out, the rest run
        gone = {r.id for r in (*job.batch, *job.encodes)
                if r.id in self.node.failed or r.id in failed}
        planned = frozenset(r.id for r in job.batch)  # the batch the loop will report
        if gone:
            from ditmem.parallel.node import DeviceLost

            for rid in sorted(gone - failed):
                reason = self.node.failed[rid]
                self._fail([rid], DeviceLost(f"{rid} failed: {reason}"),
                           f"job {job.job_id}: {rid} left out ({reason})")
        if gone:  # their moves stay: each is skipped in its place (``_GroupJob._move``)
            job = Job(job.job_id, job.group, [r for r in job.batch if r.id not in gone],
                      job.steps, job.moves, [r for r in job.encodes if r.id not in gone],
                      [r for r in job.decodes if r.id not in gone], job.split_decodes)
        run_job(job, _GroupJob(self, job, t, started, owned, lanes, order, planned))


class _MoveOrder:
    """One job's place in each moved request's order of moves: built on the loop's thread
    at launch (so in launch order), for the ids ``rids`` the job moves. ``before(rid)``
    waits for the move of ``rid`` in the job launched before (its seconds back), ``done(rid)``
    lets the next one go once this job's last move of ``rid`` is done (a job may park a
    member of its own batch and restore it: two moves, in the job's own order); ``end()``
    lets every one go (the job is over, moved or not)."""

    def __init__(self, moving: dict[str, threading.Event], lock: threading.Lock,
                 rids: list[str]) -> None:
        self._moving, self._lock = moving, lock
        self._prev: dict[str, threading.Event | None] = {}
        self._mine: dict[str, threading.Event] = {}
        self._left: dict[str, int] = {}  # this job's moves of each id not yet done
        for rid in rids:  # the caller holds ``lock``
            self._left[rid] = self._left.get(rid, 0) + 1
            if rid not in self._mine:  # a second move of rid follows the first, not itself
                self._prev[rid] = moving.get(rid)
                self._mine[rid] = moving[rid] = threading.Event()

    def before(self, rid: str) -> float:
        prev = self._prev.get(rid)
        if prev is None or prev.is_set():
            return 0.0
        mark = time.perf_counter()
        prev.wait()
        return time.perf_counter() - mark

    def done(self, rid: str) -> None:
        ev = self._mine.get(rid)
        if ev is None:
            return
        self._left[rid] -= 1
        if self._left[rid] > 0:
            return
        ev.set()
        with self._lock:
            if self._moving.get(rid) is ev:
                del self._moving[rid]

    def end(self) -> None:
        for rid in self._mine:
            self._left[rid] = 1
            self.done(rid)


class _GroupJob(JobStages):
    """One job on the node engine's group (``run_job`` calls its stages in the loop's
    order); ``timings`` is the job's, filled as each stage ends; ``owned``: the ids a
    failure of the job fails (kept up to date as the job hands requests back); ``lanes``:
    each decode's device (the loop's ``decode_lanes`` of the job it launched); ``planned``:
    the ids of the batch the loop launched (it reports the job's step as theirs, so a step
    that ran without one of them reports no step time)."""

    def __init__(self, devices: EngineDevices, job: Job, timings: Timings, started: float,
                 owned: list[str], lanes: dict[str, int], order: _MoveOrder,
                 planned: frozenset[str]) -> None:
        super().__init__(job)
        self.devices = devices
        self.node = devices.node
        self.clock = devices.clock
        self.group = tuple(job.group.devices)
        self.timings = timings
        self.started = started
        self.owned = owned
        self.lanes = lanes
        self.order = order
        self.planned = planned

    def _hand_back(self, released: tuple[int, ...], decoded: tuple[str, ...] = (), *,
                   stepped: bool = False) -> None:
        """Tell the loop (a partial ``Completion``) that ``released`` devices are free and
        ``decoded`` requests done (``stepped``: the job's steps have ended)."""
        with self.devices._lock:
            self.owned[:] = [rid for rid in self.owned if rid not in decoded]
        self.devices._done.put(Completion(self.job, self.started, self.devices.now(),
                                          self.timings, released, decoded, stepped,
                                          last=False))

    def _moved(self, rid: str, timings: list[tuple[str, object]]) -> None:
        """One planned move done as ``timings`` (``(kind, MoveTiming)`` per command): its
        own seconds (``Timings.move_s``, what the policy's ``observe_move`` learns from)
        and its wait for devices busy with another job (``Timings.wait_s``)."""
        own = sum(t.own_s for _, t in timings)
        self.timings.transfer_s += own
        self.timings.wait_s += sum(t.wait_s for _, t in timings)
        self.timings.move_s.append(own)
        with self.devices._lock:
            self.devices.link_busy_s += own
            self.devices.moves.extend(MoveRecord(k, rid, t) for k, t in timings)
        self._event("moved", [rid], own)

    def _restore(self, rid: str, dst) -> object:
        timing = self.node.restore(rid, tuple(dst.devices))
        if timing is None:
            raise MemoryError(f"resume of {rid} onto {dst}: no room")
        return timing

    def start_offload(self, rid: str) -> None:
        """Park ``rid`` on the host (see :meth:`_move`)."""
        self._move(rid, "park of", "the host",
                   lambda: [("offload", self.node.park(rid))])

    def start_restore(self, rid: str) -> None:
        """Bring ``rid`` onto the job's group (see :meth:`_move`)."""
        mv = self.restores[rid]

        def run() -> list[tuple[str, object]]:
            if mv.src is None:
                return [("restore", self._restore(rid, mv.dst))]
            if mv.kind == "host":  # the plan priced it through the host: park, restore
                park = self.node.park(rid)
                return [("host-park", park), ("host-restore", self._restore(rid, mv.dst))]
            return [("peer", self.node.move(rid, tuple(mv.dst.devices)))]

        self._move(rid, "move of", f"onto {mv.dst}", run)

    def _move(self, rid: str, what: str, where: str, run: Callable[[], list]) -> None:
        """One move of ``rid`` in the job's order: after its move in the job launched
        before, ``run()`` (its ``(kind, MoveTiming)`` commands, into ``_moved``). A request
        that has failed already (in an earlier job, with a lost device, or in this job's
        park before its restore) is not moved; one whose move fails fails alone (pages
        released) and the job goes on without it. Either way its place in the job's
        ``Timings.move_s`` (the loop zips it with the job's moves) is kept, with 0 s, and
        the next job's move of it may go."""
        self.timings.wait_s += self.order.before(rid)
        timed = len(self.timings.move_s)
        try:
            with self.devices._lock:
                skip = rid in self.devices.failed
            if not skip:
                self._moved(rid, run())
        except Exception as exc:
            msg = f"job {self.job.job_id}: {what} {rid} {where}: {type(exc).__name__}: {exc}"
            log.error(msg)
            self.devices._fail([rid], exc, msg)
            with self.devices._lock:
                self.owned[:] = [i for i in self.owned if i != rid]
        finally:
            if len(self.timings.move_s) == timed:  # its place in the job's moves: no time
                self.timings.move_s.append(0.0)
            self.order.done(rid)

    def encode(self, rids: list[str]) -> None:
        node, devices, mark = self.node, self.group, self.clock()

        def encode(request, device: int) -> None:
            begin = self.clock()
            if not node.encode(self.devices.to_generation(request), device):
                raise MemoryError(f"encode of {request.id} on device {device}: no room")
            node.move(request.id, devices)  # onto the whole group (no-op at degree 1)
            self._event("encoded", [request.id], self.clock() - begin)

        _spread([self.requests[rid] for rid in rids], devices, encode)
        self.timings.encode_s = self.clock() - mark

    def step(self, rids: list[str], steps: int, blocks: int | None) -> list[str]:
        mark = self.clock()
        with self.devices._lock:  # a member whose move failed in this job is left out
            rids = [rid for rid in rids if rid not in self.devices.failed]
        for _ in range(steps if rids else 0):
            begin = self.clock()
            self.node.step([(self.group, list(rids))])
            self._event("stepped", rids, self.clock() - begin)
        self.timings.step_s = self.clock() - mark
        if set(rids) != self.planned:  # not the batch the loop reports: no measurement of it
            self.timings.step_s = 0.0
        return [r.id for r in self.job.decodes]

    def _event(self, kind: str, rids: list[str], seconds: float) -> None:
        if self.devices.on_event is not None and rids:
            self.devices.on_event(kind, list(rids), seconds)

    def decode(self, rids: list[str]) -> None:
        """Each decode on its ``lanes`` device: first every decoding request is gathered
        onto its device (a re-shard reads from all the group's devices, so it runs while
        they are all still this job's; a request whose gather fails fails alone, handed
        back done with the steps' end); then the devices without a decode go back to the
        loop, and each request is handed back as its decode ends, its device with the last
        decode on it."""
        owner, node, mark = self.devices, self.node, self.clock()
        decodes = list(self.job.decodes)
        with owner._lock:  # the steps are over: a failure from here fails only the decodes
            self.owned[:] = [r.id for r in decodes]
        sets = decode_devices(self.job.group, len(decodes), self.job.split_decodes)
        if any(len(ds) > 1 for ds in sets):
            self._decode_split(decodes, sets)
            self.timings.decode_s = self.clock() - mark
            return
        lanes: dict[int, list] = {}
        dropped = []
        for request in decodes:
            device = self.lanes[request.id]
            if not self._gather(request.id, device, dropped):
                continue
            lanes.setdefault(device, []).append(request)
        self._hand_back(tuple(d for d in self.group if d not in lanes), tuple(dropped),
                        stepped=True)
        left = {d: len(rs) for d, rs in lanes.items()}

        def decode(request, device: int) -> None:
            begin = self.clock()
            image = node.decode(request.id, owner.decode_tile)
            node.release(request.id)
            self._measured(request.id, 1, begin)
            self._deliver(request.id, image, begin)
            left[device] -= 1  # only this device's lane touches its count
            self._hand_back((device,) if not left[device] else (), (request.id,))

        _in_lanes(lanes, decode)
        self.timings.decode_s = self.clock() - mark

    def _measured(self, rid: str, devices: int, begin: float) -> None:
        """``rid``'s decode over ``devices`` devices, begun at ``begin``, ended now: into
        the job's ``Timings.decodes`` (the policy's ``NodeCost.observe_decode``)."""
        secs = self.clock() - begin
        with self.devices._lock:
            self.timings.decodes.append((rid, devices, secs))

    def _deliver(self, rid: str, image, begin: float) -> None:
        """``rid``'s decoded ``image`` (its decode began at ``begin``): the event, then kept
        and handed on as the owner asks."""
        owner = self.devices
        self._event("decoded", [rid], self.clock() - begin)
        if owner.keep_outputs:
            with owner._lock:
                owner.outputs[rid] = image
        if owner.on_output is not None:
            owner.on_output(rid, image)

    def _gather(self, rid: str, device: int, dropped: list[str]) -> bool:
        """Move ``rid`` onto ``device`` alone for its decode; when that fails the request
        fails alone (pages released) and joins ``dropped`` (False), as does one that
        failed earlier in the job."""
        with self.devices._lock:
            if rid in self.devices.failed:
                dropped.append(rid)
                return False
        try:
            self.node.move(rid, (device,))
        except Exception as exc:  # that request fails (pages released); others decode
            msg = (f"job {self.job.job_id}: gather of {rid} onto device {device}: "
                   f"{type(exc).__name__}: {exc}")
            log.error(msg)
            self.devices._fail([rid], exc, msg)
            dropped.append(rid)
            return False
        return True

    def _tiles_of(self, request) -> int:
        """How many tiles ``request``'s decode runs as (1: whole, or no ``decode_tile``),
        as the profile prices it (``CostModel.decode_tiles``) and ``TiledDecode`` cuts it."""
        from ditmem.scheduler.decode_lane import tile_sizes

        tile = self.devices.decode_tile
        if tile is None or (request.width <= tile[0] and request.height <= tile[0]):
            return 1
        return (len(tile_sizes(request.height, tile[0], tile[1]))
                * len(tile_sizes(request.width, tile[0], tile[1])))

    def _decode_split(self, decodes: list, sets: list[tuple[int, ...]]) -> None:
        """Each decode on its ``sets`` devices (``decode_devices``; fewer decodes than
        devices), its tiles spread over them (``NodeEngine.decode_split``; one tile or no
        tile geometry: on its lane alone). Each request is gathered onto its lane first (as
        :meth:`decode`); then the devices with no work go back to the loop, each other
        device as its own tiles end or when the loop takes it back between two of them
        (:meth:`EngineDevices.reclaim`; as the simulator), each lane with its request when
        its blend ends. A request whose gather or decode fails fails alone (handed back
        done, with its devices)."""
        owner, node = self.devices, self.node
        work: dict[int, list] = {}
        used: dict[str, tuple[int, ...]] = {}
        dropped = []
        for request, ds in zip(decodes, sets, strict=True):
            if not self._gather(request.id, ds[0], dropped):
                continue
            used[request.id] = ds[:min(len(ds), self._tiles_of(request))]
            work[ds[0]] = [request]
        busy = {d for ds in used.values() for d in ds}
        self._hand_back(tuple(d for d in self.group if d not in busy), tuple(dropped),
                        stepped=True)
        job_id = self.job.job_id

        def decode(request, lane: int) -> None:
            ds, begin = used[request.id], self.clock()
            freed: list[int] = []
            moved: list[int] = []  # spares that stopped with tiles left (taken back)
            lock = threading.Lock()

            def taken(d: int) -> bool:  # asked before one of d's tiles but its first
                if owner._is_taken(job_id, d):
                    with lock:
                        moved.append(d)
                    return True
                return False

            def tiles_done(others: tuple[int, ...]) -> None:  # from a spare's thread
                with lock:
                    freed.extend(others)
                self._hand_back(others)

            try:
                if len(ds) == 1:
                    image = node.decode(request.id, owner.decode_tile)
                else:
                    image = node.decode_split(request.id, ds, owner.decode_tile, tiles_done,
                                              taken)
                node.release(request.id)
                lost = [d for d in ds[1:] if d in node.dead]  # their tiles ran on the lane
                if not moved and not lost:  # ran as split (a take-back too late moved nothing)
                    self._measured(request.id, len(ds), begin)
            except Exception as exc:  # this request fails; the job's others go on
                msg = (f"job {self.job.job_id}: split decode of {request.id} on {ds}: "
                       f"{type(exc).__name__}: {exc}")
                log.error(msg)
                owner._fail([request.id], exc, msg)
                self._hand_back(tuple(d for d in ds if d not in freed), (request.id,))
                return
            self._deliver(request.id, image, begin)
            self._hand_back(tuple(d for d in ds if d not in freed), (request.id,))

        _in_lanes(work, decode)
