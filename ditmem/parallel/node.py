"""The node engine: one worker process per device, the control path to them, and what a
dead worker means.

    with NodeEngine("tiny-qwen-image", num_devices=2) as node:
        node.encode(request, device=0)                 # degree 1 on device 0
        node.move(request.request_id, (0, 1))          # re-shard to degree 2 (peer to peer)
        node.step([((0, 1), [request.request_id])])    # steps run on groups, concurrently
        node.park(request.request_id)                  # parts into host pages
        node.resume(request.request_id, (1,))          # onto another device, degree 1
        image = node.decode(request.request_id)

The engine process runs no model: it sends each group its part of the plan (small
records, :mod:`ditmem.parallel.commands`) and collects replies with timings and page
counts. Workers are started once (``torch.multiprocessing``, spawn) and join every aligned
group's process group at start. Host pools are created here in shared memory and handed
to every worker, so a request parked by one device can be restored by any other.

A worker that dies fails exactly the requests with a part on its device (their reason is
in :attr:`NodeEngine.failed`); calls that needed it raise :class:`DeviceLost`; the other
devices keep serving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from multiprocessing import shared_memory

import numpy as np
import torch.multiprocessing as tmp

from ditmem.memory import HostPool
from ditmem.parallel import commands as cmd
from ditmem.parallel.groups import aligned_groups, free_port, is_aligned
from ditmem.parallel.worker import WorkerConfig, worker_main

log = logging.getLogger(__name__)


#: requests whose peak pages the engine keeps (the newest; a server takes each finished
#: request's with ``peak_pages(rid, forget=True)``)
PEAKS_KEPT = 10_000


class DeviceLost(RuntimeError):
    """A command could not run because a device's worker is gone."""


class CommandFailed(RuntimeError):
    """A worker reported an error for a command (the message is the worker's)."""


@dataclass(slots=True)
class GroupResult:
    """One group's step: ``devices``, ``seconds`` (slowest device's wall time),
    ``cpu_seconds`` (largest worker CPU time), per-device ``device_pages`` used after it."""

    devices: tuple[int, ...]
    seconds: float
    device_pages: dict[int, int]
    cpu_seconds: float = 0.0


@dataclass(slots=True)
class MoveTiming:
    """One move's times, all ``time.perf_counter`` seconds (one clock for every process of
    the machine): ``wall_s`` from the engine's send to the last reply; per device,
    ``queued_s`` from the send to the worker beginning the command (the pipe, plus the
    wait behind the worker's previous command: a source device still running another
    job's step) and ``device_s`` the command on the worker (in a collective move, the
    devices that began first wait inside it for the last one)."""

    wall_s: float
    device_s: dict[int, float] = field(default_factory=dict)
    queued_s: dict[int, float] = field(default_factory=dict)

    @property
    def wait_s(self) -> float:
        """Until the last device began the move: the wait for busy devices."""
        return max(self.queued_s.values(), default=0.0)

    @property
    def own_s(self) -> float:
        """From the last device beginning the move to its end: the move without the wait
        for busy devices (what ``NodeCost.observe_move`` learns from)."""
        return max(0.0, self.wall_s - self.wait_s)

    @property
    def copy_s(self) -> float:
        """The last device's command (it waited for nobody): the copy itself."""
        last = max(self.queued_s, key=self.queued_s.get, default=None)
        return self.device_s[last] if last is not None else self.wall_s

    def parts(self) -> dict[str, float]:
        """Where the wall time went: ``wait`` (for busy devices), ``copy`` (the last
        device's command), ``control`` (the rest: the pipes' round trip)."""
        return {"wait": self.wait_s, "copy": self.copy_s,
                "control": max(0.0, self.wall_s - self.wait_s - self.copy_s)}



def cover_group(devices: set[int], num_devices: int) -> tuple[int, ...]:
    """The smallest aligned group containing ``devices``."""
    for group in aligned_groups(num_devices):
        if devices <= set(group):
            return group
    raise ValueError(f"cover_group: devices {sorted(devices)} are not all in 0..{num_devices - 1}")


class _Channel:
    """One worker's pipe: commands go out in order, replies come back in the same order
    and resolve the futures of their commands (a reader thread)."""

    def __init__(self, device: int, conn, on_lost) -> None:
        self.device = device
        self.conn = conn
        self.pending: deque[Future] = deque()
        self.lost: str | None = None
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"ditmem-reply-{device}",
                                        daemon=True)

    def start(self) -> Future:
        """The future of the worker's first message (ready, or its start error)."""
        fut: Future = Future()
        self.pending.append(fut)
        self._reader.start()
        return fut

    def send(self, command) -> Future:
        fut: Future = Future()
        with self._lock:
            if self.lost is not None:
                fut.set_exception(DeviceLost(self.lost))
                return fut
            self.pending.append(fut)
            try:
                self.conn.send(command)
            except (BrokenPipeError, OSError):
                pass  # the reader sees the end of the pipe and fails the pending futures
        return fut

    def _read(self) -> None:
        while True:
            error = None
            try:
                reply = self.conn.recv()
            except (EOFError, OSError):  # the worker exited (or was killed)
                break
            except Exception as exc:  # noqa: BLE001 - a reply that does not unpickle (e.g.
                # a worker of other code): that command fails, the channel reads on
                error = CommandFailed(f"device {self.device}: its reply could not be read: "
                                      f"{type(exc).__name__}: {exc}")
            with self._lock:
                fut = self.pending.popleft() if self.pending else None
            if fut is not None:
                if error is None:
                    fut.set_result(reply)
                else:
                    fut.set_exception(error)
        reason = self._on_lost(self.device)
        with self._lock:
            self.lost = reason
            pending, self.pending = list(self.pending), deque()
        for fut in pending:
            fut.set_exception(DeviceLost(reason))


class NodeEngine:
    """Device workers of one node and the control path (see module docstring).

    model: a name or folder for ``ditmem.models.load``; pool_pages / host_pages: pages per
    device pool / per device's host pool, of ``page_bytes``; device_type "cpu" (workers
    pinned to cores), "cuda" or "npu"; start_timeout_s bounds the start (model loading);
    command_timeout_s bounds every call; on_lost(device, reason, failed request ids) is
    called (from a reader thread) when a worker is gone. Calls are thread-safe: commands to several
    devices are sent under one lock, so every worker sees collective commands in the same
    order; calls on disjoint devices run concurrently.
    """

    def __init__(self, model: str = "tiny-qwen-image", num_devices: int = 2, *,
                 device_type: str = "cpu", pool_pages: int = 1024, page_bytes: int = 1 << 16,
                 host_pages: int = 1024, model_kwargs: dict | None = None,
                 start_timeout_s: float = 300.0, command_timeout_s: float = 600.0,
                 on_lost: Callable[[int, str, list[str]], None] | None = None) -> None:
        if num_devices < 1:
            raise ValueError(f"num_devices: expected >= 1, got {num_devices}")
        self.num_devices = num_devices
        self.page_bytes, self.pool_pages, self.host_pages = page_bytes, pool_pages, host_pages
        self.command_timeout_s = command_timeout_s
        self.holders: dict[str, tuple[int, ...]] = {}
        self.parked: dict[str, list] = {}
        self.failed: dict[str, str] = {}
        self.dead: dict[int, str] = {}
        #: parts the engine no longer tracks, by request: a failed request's left on live
        #: devices, a failed move's devices (freed by :meth:`release`)
        self.orphans: dict[str, tuple[int, ...]] = {}
        #: device pages in use per device, from the latest reply of each (no round trip)
        self.device_pages: dict[int, int] = dict.fromkeys(range(num_devices), 0)
        #: pages (device or host) each request holds per device, from the latest replies (a
        #: restore stops counting the host copies it leaves behind at once: ``restore``)
        self.request_pages: dict[str, dict[int, int]] = {}
        #: each request's peak pages over its devices (see :meth:`peak_pages`)
        self._peaks: dict[str, int] = {}
        self.on_lost = on_lost
        self._lock = threading.RLock()
        self._send_lock = threading.Lock()
        self._closing = False
        self.hosts = [self._shared_host(host_pages, page_bytes, device_type)
                      for _ in range(num_devices)]
        config = WorkerConfig(model, num_devices, free_port(), device_type, pool_pages,
                              page_bytes, model_kwargs)
        ctx = tmp.get_context("spawn")
        self._channels, self._procs = [], []
        for index in range(num_devices):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(index, config, self.hosts, there),
                               name=f"ditmem-device-{index}", daemon=True)
            proc.start()
            there.close()
            self._channels.append(_Channel(index, here, self._lost))
            self._procs.append(proc)
        ready = [ch.start() for ch in self._channels]
        try:
            replies = self._wait(dict(enumerate(ready)), start_timeout_s)
        except BaseException:
            self.close()
            raise
        bad = {d: r.error for d, r in replies.items() if not r.ok}
        if bad:
            self.close()
            raise RuntimeError(f"NodeEngine: workers failed to start: {bad}")
        self.pids = [replies[d].value for d in range(num_devices)]

    @staticmethod
    def _shared_host(num_pages: int, page_bytes: int, device_type: str) -> HostPool:
        host = HostPool(num_pages, page_bytes, pin_memory=False)
        for chunk in host.chunks:
            chunk.share_memory_()
        return host

    # ------------------------------------------------------------------ plumbing
    def _lost(self, device: int) -> str:
        """Called by a channel's reader when its worker is gone: fail its requests."""
        proc = self._procs[device]
        proc.join(timeout=5)
        if self._closing:
            return f"device {device} worker stopped (engine closed)"
        reason = f"device {device} worker exited (exit code {proc.exitcode})"
        with self._lock:
            if device in self.dead:
                return self.dead[device]
            self.dead[device] = reason
            log.warning("device %d lost: %s", device, reason)
            failed = []
            for rid, devices in list(self.holders.items()):
                if device in devices:
                    self.failed[rid] = reason
                    del self.holders[rid]
                    self.orphans[rid] = tuple(sorted({*self.orphans.get(rid, ()), *devices}
                                                     - {device}))
                    failed.append(rid)
            for rid, parts in list(self.parked.items()):
                if any(p.device == device for p in parts):
                    self.failed[rid] = reason
                    del self.parked[rid]
                    self.orphans[rid] = tuple(sorted({*self.orphans.get(rid, ()),
                                                     *(p.device for p in parts)} - {device}))
                    failed.append(rid)
        if self.on_lost is not None:
            self.on_lost(device, reason, failed)
        return reason

    def reap(self) -> dict[int, str]:
        """Every lost device with its reason (waits briefly for workers that have exited
        but whose loss is still being recorded)."""
        for d, p in enumerate(self._procs):
            if d not in self.dead and p.exitcode is not None:
                self._channels[d]._reader.join(timeout=10)
        with self._lock:
            return dict(self.dead)

    def submit(self, commands: dict[int, object]) -> dict[int, Future]:
        """Send each device its command (all under one lock) without waiting; the futures
        resolve to the workers' ``Reply`` (or raise ``DeviceLost``)."""
        with self._send_lock:
            return {d: self._channels[d].send(c) for d, c in commands.items()}

    def _wait(self, futures: dict[int, Future], timeout_s: float) -> dict[int, cmd.Reply]:
        done, waiting = wait(list(futures.values()), timeout=timeout_s)
        if waiting:
            late = sorted(d for d, f in futures.items() if f in waiting)
            raise TimeoutError(f"NodeEngine: devices {late} did not answer within {timeout_s} s")
        replies, lost = {}, []
        for d, f in futures.items():
            try:
                replies[d] = f.result()
            except DeviceLost as exc:
                lost.append(str(exc))
        if lost:
            raise DeviceLost("; ".join(lost))
        return replies

    def _call(self, commands: dict[int, object]) -> dict[int, cmd.Reply]:
        """Send each device its command, then wait for all; ``DeviceLost`` if one is gone
        (before or during), ``CommandFailed`` with the workers' messages if one failed."""
        with self._lock:
            gone = sorted(set(commands) & set(self.dead))
        if gone:
            raise DeviceLost(f"devices {gone} are lost: {[self.dead[d] for d in gone]}")
        replies = self._wait(self.submit(commands), self.command_timeout_s)
        self._note_pages(replies)
        errors = {d: r.error for d, r in replies.items() if not r.ok}
        if errors:
            raise CommandFailed("; ".join(f"device {d}: {e}" for d, e in sorted(errors.items())))
        return replies

    def _note_pages(self, replies: dict[int, cmd.Reply]) -> None:
        """The page counts the workers' ``replies`` carry."""
        with self._lock:
            for d, r in replies.items():
                self.device_pages[d] = r.device_pages
                for rid, n in r.request_pages.items():
                    if n:
                        self.request_pages.setdefault(rid, {})[d] = n
                    elif rid in self.request_pages:  # nothing left there
                        self.request_pages[rid].pop(d, None)
                        if not self.request_pages[rid]:
                            del self.request_pages[rid]

    def _post(self, commands: dict[int, object]) -> None:
        """Send each device its command and go on: each reply, when it comes, updates the
        page counts; a failure is logged (there is no caller left to raise to). A worker
        runs its commands in the order sent, so whatever is sent to it later sees the
        command done."""
        def noted(device: int, future: Future) -> None:
            try:
                reply = future.result()
            except Exception as exc:  # a lost device: nothing left to free there
                log.warning("device %d: %s failed: %s", device, commands[device], exc)
                return
            self._note_pages({device: reply})
            if not reply.ok:
                log.warning("device %d: %s failed: %s", device, commands[device], reply.error)

        for d, f in self.submit(commands).items():
            f.add_done_callback(lambda f, d=d: noted(d, f))

    def _check_devices(self, devices: tuple[int, ...]) -> tuple[int, ...]:
        devices = tuple(devices)
        if not devices or not is_aligned(devices, self.num_devices):
            raise ValueError(f"devices {devices} are not an aligned group of "
                             f"{self.num_devices} devices ({aligned_groups(self.num_devices)})")
        return devices

    def _holders(self, request_id: str) -> tuple[int, ...]:
        with self._lock:
            if request_id in self.failed:
                raise DeviceLost(f"{request_id} failed: {self.failed[request_id]}")
            try:
                return self.holders[request_id]
            except KeyError:
                raise KeyError(f"{request_id!r} is not held on any device"
                               + (" (it is parked)" if request_id in self.parked else "")
                               ) from None

    # ------------------------------------------------------------------ requests
    def encode(self, request, device: int) -> bool:
        """Encode ``request`` on ``device`` (degree 1). False when its pool has no room."""
        rid = request.request_id
        if not rid:
            raise ValueError("encode: request.request_id must be set")
        if rid in self.holders or rid in self.parked:
            raise ValueError(f"encode: {rid!r} is already on the node")
        self._check_devices((device,))
        ok = self._call({device: cmd.Encode(request)})[device].value
        if ok:
            with self._lock:
                self.holders[rid] = (device,)
            self._note_peak([rid])
        return ok

    def _note_peak(self, request_ids) -> None:
        """Raise each request's peak to the pages it holds now, summed over its devices."""
        with self._lock:
            for rid in request_ids:
                now = sum(self.request_pages.get(rid, {}).values())
                if now > self._peaks.get(rid, 0):
                    self._peaks.pop(rid, None)  # newest last: the oldest go first below
                    self._peaks[rid] = now
            while len(self._peaks) > PEAKS_KEPT:
                del self._peaks[next(iter(self._peaks))]

    def peak_pages(self, request_id: str, *, forget: bool = False) -> int:
        """The most pages ``request_id`` held at once over its life so far: after its
        encode and each of its steps, the pages (device or host) of its parts summed over
        every device holding one (0 if unknown). ``forget``: drop the record (a finished
        request's; the latest :data:`PEAKS_KEPT` records are kept otherwise)."""
        with self._lock:
            return (self._peaks.pop(request_id, 0) if forget
                    else self._peaks.get(request_id, 0))

    def step(self, plan: list[tuple[tuple[int, ...], list[str]]]) -> list[GroupResult]:
        """Run one whole step of each ``(devices, request_ids)`` entry, the groups
        concurrently (they must not share devices). Every request must be held on exactly
        its entry's devices."""
        used: set[int] = set()
        commands = {}
        for devices, ids in plan:
            devices = self._check_devices(devices)
            if used & set(devices):
                raise ValueError(f"step: groups overlap on devices {sorted(used & set(devices))}")
            used |= set(devices)
            for rid in ids:
                if self._holders(rid) != devices:
                    raise ValueError(f"step: {rid} is held on {self.holders[rid]}, not {devices}")
            for d in devices:
                commands[d] = cmd.Step(list(ids), devices)
        replies = self._call(commands)
        self._note_peak([rid for _, ids in plan for rid in ids])
        return [GroupResult(tuple(devices), max(replies[d].seconds for d in devices),
                            {d: replies[d].device_pages for d in devices},
                            max(replies[d].cpu_seconds for d in devices))
                for devices, _ in plan]

    def _timed(self, commands: dict[int, object]) -> tuple[dict[int, cmd.Reply], MoveTiming]:
        mark = time.perf_counter()
        replies = self._call(commands)
        return replies, MoveTiming(time.perf_counter() - mark,
                                   {d: r.seconds for d, r in replies.items()},
                                   {d: max(0.0, r.started_at - mark) for d, r in replies.items()})

    def move(self, request_id: str, devices: tuple[int, ...], *,
             over_cover: bool = False) -> MoveTiming:
        """Re-shard a held request onto ``devices`` (another degree and/or other devices)
        over the device link, between steps, point to point between exactly its old and
        new devices (no other worker is involved or waited for); its timing (zero when
        already there). ``over_cover``: the session-5 way instead, a collective over
        :func:`cover_group` of both (every device of it joins): the baseline of
        ``benchmarks/parallel/bench_moves.py``."""
        new = self._check_devices(devices)
        old = self._holders(request_id)
        if new == old:
            return MoveTiming(0.0)
        if over_cover:
            cover = cover_group(set(old) | set(new), self.num_devices)
            commands = {d: cmd.Reshard(request_id, old, new, cover) for d in cover}
        else:
            commands = {d: cmd.Reshard(request_id, old, new) for d in sorted({*old, *new})}
        try:
            _, timing = self._timed(commands)
        except Exception:
            # the old holders may have sent and freed their parts and some new holders kept
            # theirs (another ran out of room): a release must reach every one of them
            with self._lock:
                self.orphans[request_id] = tuple(sorted({*self.orphans.get(request_id, ()),
                                                         *old, *new}))
            raise
        with self._lock:
            self.holders[request_id] = new
        return timing

    def park(self, request_id: str) -> MoveTiming:
        """Offload every part of a held request into its devices' host pages (their device
        pages are freed); its timing."""
        old = self._holders(request_id)
        replies, timing = self._timed({d: cmd.Offload(request_id) for d in old})
        with self._lock:
            del self.holders[request_id]
            self.parked[request_id] = [replies[d].value for d in old]
        return timing

    def resume(self, request_id: str, devices: tuple[int, ...]) -> bool:
        """Restore a parked request onto ``devices`` (any aligned group, any degree) from
        the host pages; False (still parked) when a pool has no room."""
        return self.restore(request_id, devices) is not None

    def restore(self, request_id: str, devices: tuple[int, ...]) -> MoveTiming | None:
        """:meth:`resume` with the restore's timing; None (still parked) when a pool has no
        room. The host copies are released after it without waiting (:meth:`_post`)."""
        new = self._check_devices(devices)
        if request_id in self.failed:
            raise DeviceLost(f"{request_id} failed: {self.failed[request_id]}")
        if request_id not in self.parked:
            raise KeyError(f"resume: {request_id!r} is not parked")
        parts = self.parked[request_id]
        replies, timing = self._timed({d: cmd.Adopt(request_id, parts, new) for d in new})
        if not all(r.value for r in replies.values()):
            self._call({d: cmd.Release(request_id) for d in new if replies[d].value})
            return None
        # The parts' host copies are freed without waiting for their devices: one may be
        # busy with another job for seconds (a decode), and a restore from the host must
        # wait for no device the policy did not give it.
        self._post({p.device: cmd.DropHost(request_id) for p in parts})
        with self._lock:
            del self.parked[request_id]
            self.holders[request_id] = new
            # and no longer counted on a device it left (``peak_pages``): the DropHost
            # reply of a busy device may come after the request's next steps elsewhere
            counts = self.request_pages.get(request_id, {})
            for p in parts:
                if p.device not in new:
                    counts.pop(p.device, None)
        return timing

    def decode(self, request_id: str, tile: tuple[int, int] | None = None) -> np.ndarray:
        """VAE-decode a finished request (moved to its first device first when sharded);
        ``tile`` = (tile_px, stride_px): the VAE's tiled decode where the model has one."""
        devices = self._holders(request_id)
        if len(devices) > 1:
            self.move(request_id, devices[:1])
            devices = devices[:1]
        ref = self._call({devices[0]: cmd.Decode(request_id, tile)})[devices[0]].value
        return _take_image(ref)

    def decode_split(self, request_id: str, devices: tuple[int, ...], tile: tuple[int, int],
                     on_tiles: Callable[[tuple[int, ...]], None] | None = None,
                     taken: Callable[[int], bool] | None = None) -> np.ndarray:
        """VAE-decode a finished request held at degree 1 on ``devices[0]`` with its tiles
        (``tile`` = (tile_px, stride_px), the VAE's tiled decode) spread over ``devices``
        (any devices, tile t on the (t mod k)-th, k = min(len(devices), tiles):
        ``scheduler.node.cost.split_tiles``): the holder shares its latents through shared
        memory, each other device decodes its tiles one command each (they come back through
        shared memory), and the holder blends them, as :meth:`decode` with ``tile`` would:
        ``uint8 [H, W, 3]``, the same bits. ``on_tiles((device,))`` as each other device's
        tiles end (it is free from then: ``scheduler.node.device.split_ends``). ``taken(d)``,
        asked before each of device d's tiles but its first: True takes d back there — it
        stops, ``on_tiles((d,))``, and its tiles left run on the holder after the holder's
        own. A spare lost mid-split (``DeviceLost``) is as if taken back — its tile in
        progress and those after it run on the holder — except that ``on_tiles`` does not
        hand it back. A failed command of the holder, or any other failure, raises
        (``CommandFailed`` / ``DeviceLost``) once every device has stopped; the holder's
        decode is dropped by :meth:`release`; no segment is left behind (every tile that
        came back is unlinked), except one a device that timed out makes after it."""
        from ditmem.parallel.worker import unlink_shared
        from ditmem.scheduler.node.cost import split_tiles

        lane = devices[0]
        if self._holders(request_id) != (lane,):
            raise ValueError(f"decode_split: {request_id} is held on "
                             f"{self.holders.get(request_id)}, not on device {lane} alone")
        if len(set(devices)) != len(devices) or not all(0 <= d < self.num_devices
                                                         for d in devices):
            raise ValueError(f"decode_split: devices {devices} repeat or are out of range")
        latent, units = self._call({lane: cmd.ShareLatent(request_id, tile)})[lane].value
        parts = split_tiles(units, len(devices))
        tiles: dict[int, cmd.SharedTensor] = {}
        errors: list[BaseException] = []
        cond = threading.Condition()
        left: deque[int] = deque()  # tiles of the devices taken back, for the holder
        running = len(parts) - 1

        def spare(device: int, indices: list[int]) -> None:
            nonlocal running
            n, lost = 0, False
            try:
                for n, k in enumerate(indices):
                    if n and (errors or (taken is not None and taken(device))):
                        with cond:
                            left.extend(indices[n:])
                        break
                    ref = self._call({device: cmd.DecodeTiles(request_id, tile, [k], latent)}
                                     )[device].value[0]
                    with cond:
                        tiles[k] = ref
            except DeviceLost as exc:  # the request lives on the holder: its tiles go there
                log.warning("split decode of %s: device %d lost (%s); its tiles %s run on "
                            "device %d", request_id, device, exc, indices[n:], lane)
                lost = True
                with cond:
                    left.extend(indices[n:])
            except BaseException as exc:  # raised below, once every device has stopped
                errors.append(exc)
            finally:
                with cond:
                    running -= 1
                    cond.notify_all()
            if on_tiles is not None and not errors and not lost:
                on_tiles((device,))

        threads = [threading.Thread(target=spare, args=(devices[i], idx), daemon=True)
                   for i, idx in enumerate(parts[1:], start=1)]
        try:
            for t in threads:
                t.start()
            try:
                self._call({lane: cmd.DecodeTiles(request_id, tile, parts[0])})
                while True:  # then the tiles of the devices taken back, as they stop
                    with cond:
                        while not left and running and not errors:
                            cond.wait()
                        if errors or (not left and not running):
                            break
                        k = left.popleft()
                    self._call({lane: cmd.DecodeTiles(request_id, tile, [k])})
            except BaseException as exc:
                errors.append(exc)
                with cond:
                    cond.notify_all()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
        except BaseException:
            for ref in tiles.values():
                unlink_shared(ref.name)
            raise
        finally:
            unlink_shared(latent.name)
        try:
            ref = self._call({lane: cmd.BlendTiles(request_id, tiles)})[lane].value
        finally:
            for t in tiles.values():
                unlink_shared(t.name)
        return _take_image(ref)

    def release(self, request_id: str) -> None:
        """Free a request's pages wherever they are (device or host) on live devices."""
        with self._lock:
            devices = set(self.holders.pop(request_id, ()))
            devices |= {p.device for p in self.parked.pop(request_id, [])}
            devices |= set(self.orphans.pop(request_id, ()))
            self.request_pages.pop(request_id, None)
            live = sorted(devices - set(self.dead))
        if live:
            self._call({d: cmd.Release(request_id) for d in live})

    def peer_link_rate(self, devices: tuple[int, ...] = (0, 1), nbytes: int = 32 << 20,
                       repeats: int = 5) -> float:
        """Bytes per second of a broadcast of ``nbytes`` from the first of ``devices`` to
        the others (the receivers' median time; the peer link, one direction)."""
        devices = self._check_devices(devices)
        if len(devices) < 2:
            raise ValueError("peer_link_rate: needs a group of two or more devices")
        replies = self._call({d: cmd.LinkProbe(devices, nbytes, repeats) for d in devices})
        return nbytes / max(replies[d].value for d in devices[1:])

    def stats(self) -> dict[int, cmd.DeviceStats]:
        """Page counts of every live device."""
        live = [d for d in range(self.num_devices) if d not in self.dead]
        return {d: r.value for d, r in self._call({d: cmd.Stats() for d in live}).items()}

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Stop every worker (idempotent)."""
        self._closing = True
        for d, ch in enumerate(self._channels):
            if self._procs[d].is_alive():
                try:
                    with ch._lock:
                        ch.conn.send(cmd.Stop())
                except (BrokenPipeError, OSError):
                    pass
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for ch in self._channels:
            ch._reader.join(timeout=10)
            ch.conn.close()
        self._channels, self._procs = [], []

    def __enter__(self) -> NodeEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _take_image(ref: cmd.SharedImage) -> np.ndarray:
    """A copy of the image in a worker's segment ``ref``, the segment unlinked."""
    segment = shared_memory.SharedMemory(name=ref.name)
    try:
        return np.ndarray(ref.shape, np.dtype(ref.dtype), buffer=segment.buf).copy()
    finally:
        segment.close()
        segment.unlink()
