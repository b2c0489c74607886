"""The node engine: one worker process per device, the control path to them, and what a
dead worker means.

    with NodeEngine("tiny-qwen-image", num_devices=2) as node:
        node.encode(request, device=0)                 # degree 1 on device 0
        node.move(request.request_id, (0, 1))          # re-shard to degree 2 (device link)
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
import time
from dataclasses import dataclass
from multiprocessing import connection, shared_memory

import numpy as np
import torch.multiprocessing as tmp

from ditmem.memory import HostPool
from ditmem.parallel import commands as cmd
from ditmem.parallel.groups import aligned_groups, free_port, is_aligned
from ditmem.parallel.worker import WorkerConfig, worker_main

log = logging.getLogger(__name__)


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


def cover_group(devices: set[int], num_devices: int) -> tuple[int, ...]:
    """The smallest aligned group containing ``devices``."""
    for group in aligned_groups(num_devices):
        if devices <= set(group):
            return group
    raise ValueError(f"cover_group: devices {sorted(devices)} are not all in 0..{num_devices - 1}")


class NodeEngine:
    """Device workers of one node and the control path (see module docstring).

    model: a name or folder for ``ditmem.models.load``; pool_pages / host_pages: pages per
    device pool / per device's host pool, of ``page_bytes``; device_type "cpu" (workers
    pinned to cores), "cuda" or "npu"; start_timeout_s bounds the start (model loading);
    command_timeout_s bounds every call.
    """

    def __init__(self, model: str = "tiny-qwen-image", num_devices: int = 2, *,
                 device_type: str = "cpu", pool_pages: int = 1024, page_bytes: int = 1 << 16,
                 host_pages: int = 1024, model_kwargs: dict | None = None,
                 start_timeout_s: float = 300.0, command_timeout_s: float = 600.0) -> None:
        if num_devices < 1:
            raise ValueError(f"num_devices: expected >= 1, got {num_devices}")
        self.num_devices = num_devices
        self.command_timeout_s = command_timeout_s
        self.holders: dict[str, tuple[int, ...]] = {}
        self.parked: dict[str, list] = {}
        self.failed: dict[str, str] = {}
        self.dead: dict[int, str] = {}
        self.hosts = [self._shared_host(host_pages, page_bytes, device_type)
                      for _ in range(num_devices)]
        config = WorkerConfig(model, num_devices, free_port(), device_type, pool_pages,
                              page_bytes, model_kwargs)
        ctx = tmp.get_context("spawn")
        self._conns, self._procs = [], []
        for index in range(num_devices):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(index, config, self.hosts, there),
                               name=f"ditmem-device-{index}", daemon=True)
            proc.start()
            there.close()
            self._conns.append(here)
            self._procs.append(proc)
        try:
            ready = self._collect(set(range(num_devices)), start_timeout_s)
        except BaseException:
            self.close()
            raise
        bad = {d: r.error for d, r in ready.items() if not r.ok}
        bad.update(self.dead)
        if bad:
            self.close()
            raise RuntimeError(f"NodeEngine: workers failed to start: {bad}")
        self.pids = [ready[d].value for d in range(num_devices)]

    @staticmethod
    def _shared_host(num_pages: int, page_bytes: int, device_type: str) -> HostPool:
        host = HostPool(num_pages, page_bytes, pin_memory=False)
        for chunk in host.chunks:
            chunk.share_memory_()
        return host

    # ------------------------------------------------------------------ plumbing
    def _fail_device(self, device: int, reason: str) -> None:
        if device in self.dead:
            return
        self.dead[device] = reason
        log.warning("device %d lost: %s", device, reason)
        for rid, devices in list(self.holders.items()):
            if device in devices:
                self.failed[rid] = reason
                del self.holders[rid]
        for rid, parts in list(self.parked.items()):
            if any(p.device == device for p in parts):
                self.failed[rid] = reason
                del self.parked[rid]

    def _collect(self, devices: set[int], timeout_s: float) -> dict[int, cmd.Reply]:
        """One reply from each of ``devices``; a worker exiting meanwhile is failed."""
        replies: dict[int, cmd.Reply] = {}
        deadline = time.monotonic() + timeout_s
        waiting = set(devices)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"NodeEngine: devices {sorted(waiting)} did not answer "
                                   f"within {timeout_s} s")
            handles = {self._conns[d]: d for d in waiting}
            handles.update({self._procs[d].sentinel: d for d in waiting})
            for ready in connection.wait(list(handles), timeout=left):
                d = handles[ready]
                if d not in waiting:
                    continue
                if ready is self._conns[d]:
                    try:
                        replies[d] = self._conns[d].recv()
                        waiting.discard(d)
                        continue
                    except (EOFError, ConnectionResetError):  # it died mid-reply
                        pass
                self._procs[d].join(timeout=5)
                self._fail_device(d, f"device {d} worker exited (exit code "
                                     f"{self._procs[d].exitcode})")
                waiting.discard(d)
        return replies

    def reap(self) -> dict[int, str]:
        """Notice workers that exited since the last call (failing their requests);
        returns every lost device with its reason."""
        for d, p in enumerate(self._procs):
            if d not in self.dead and p.exitcode is not None:
                self._fail_device(d, f"device {d} worker exited (exit code {p.exitcode})")
        return dict(self.dead)

    def _call(self, commands: dict[int, object]) -> dict[int, cmd.Reply]:
        """Send each device its command, then wait for all; ``DeviceLost`` if one is gone
        (before or during), ``CommandFailed`` with the workers' messages if one failed."""
        self.reap()
        gone = sorted(set(commands) & set(self.dead))
        if gone:
            raise DeviceLost(f"devices {gone} are lost: {[self.dead[d] for d in gone]}")
        for d, c in commands.items():
            try:
                self._conns[d].send(c)
            except (BrokenPipeError, OSError):
                self._fail_device(d, f"device {d} worker is unreachable")
        replies = self._collect(set(commands) - set(self.dead), self.command_timeout_s)
        gone = sorted(set(commands) & set(self.dead))
        if gone:
            raise DeviceLost(f"devices {gone} were lost: {[self.dead[d] for d in gone]}")
        errors = {d: r.error for d, r in replies.items() if not r.ok}
        if errors:
            raise CommandFailed("; ".join(f"device {d}: {e}" for d, e in sorted(errors.items())))
        return replies

    def _check_devices(self, devices: tuple[int, ...]) -> tuple[int, ...]:
        devices = tuple(devices)
        if not devices or not is_aligned(devices, self.num_devices):
            raise ValueError(f"devices {devices} are not an aligned group of "
                             f"{self.num_devices} devices ({aligned_groups(self.num_devices)})")
        return devices

    def _holders(self, request_id: str) -> tuple[int, ...]:
        if request_id in self.failed:
            raise DeviceLost(f"{request_id} failed: {self.failed[request_id]}")
        try:
            return self.holders[request_id]
        except KeyError:
            raise KeyError(f"{request_id!r} is not held on any device"
                           + (" (it is parked)" if request_id in self.parked else "")) from None

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
            self.holders[rid] = (device,)
        return ok

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
        return [GroupResult(tuple(devices), max(replies[d].seconds for d in devices),
                            {d: replies[d].device_pages for d in devices},
                            max(replies[d].cpu_seconds for d in devices))
                for devices, _ in plan]

    def move(self, request_id: str, devices: tuple[int, ...]) -> None:
        """Re-shard a held request onto ``devices`` (another degree and/or other devices)
        over the device link, between steps."""
        new = self._check_devices(devices)
        old = self._holders(request_id)
        if new == old:
            return
        cover = cover_group(set(old) | set(new), self.num_devices)
        self._call({d: cmd.Reshard(request_id, cover, old, new) for d in cover})
        self.holders[request_id] = new

    def park(self, request_id: str) -> None:
        """Offload every part of a held request into its devices' host pages (their device
        pages are freed)."""
        old = self._holders(request_id)
        replies = self._call({d: cmd.Offload(request_id) for d in old})
        del self.holders[request_id]
        self.parked[request_id] = [replies[d].value for d in old]

    def resume(self, request_id: str, devices: tuple[int, ...]) -> bool:
        """Restore a parked request onto ``devices`` (any aligned group, any degree) from
        the host pages; False (still parked) when a pool has no room."""
        new = self._check_devices(devices)
        if request_id in self.failed:
            raise DeviceLost(f"{request_id} failed: {self.failed[request_id]}")
        if request_id not in self.parked:
            raise KeyError(f"resume: {request_id!r} is not parked")
        parts = self.parked[request_id]
        replies = self._call({d: cmd.Adopt(request_id, parts, new) for d in new})
        if not all(r.value for r in replies.values()):
            self._call({d: cmd.Release(request_id) for d in new if replies[d].value})
            return False
        self._call({p.device: cmd.DropHost(request_id) for p in parts})
        del self.parked[request_id]
        self.holders[request_id] = new
        return True

    def decode(self, request_id: str) -> np.ndarray:
        """VAE-decode a finished request (moved to its first device first when sharded)."""
        devices = self._holders(request_id)
        if len(devices) > 1:
            self.move(request_id, devices[:1])
            devices = devices[:1]
        ref = self._call({devices[0]: cmd.Decode(request_id)})[devices[0]].value
        segment = shared_memory.SharedMemory(name=ref.name)
        try:
            return np.ndarray(ref.shape, np.dtype(ref.dtype), buffer=segment.buf).copy()
        finally:
            segment.close()
            segment.unlink()

    def release(self, request_id: str) -> None:
        """Free a request's pages wherever they are (device or host) on live devices."""
        devices = set(self.holders.pop(request_id, ()))
        devices |= {p.device for p in self.parked.pop(request_id, [])}
        live = sorted(devices - set(self.dead))
        if live:
            self._call({d: cmd.Release(request_id) for d in live})

    def stats(self) -> dict[int, cmd.DeviceStats]:
        """Page counts of every live device."""
        live = [d for d in range(self.num_devices) if d not in self.dead]
        return {d: r.value for d, r in self._call({d: cmd.Stats() for d in live}).items()}

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Stop every worker (idempotent)."""
        for d, conn in enumerate(self._conns):
            if d not in self.dead and self._procs[d].is_alive():
                try:
                    conn.send(cmd.Stop())
                except (BrokenPipeError, OSError):
                    pass
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []

    def __enter__(self) -> NodeEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
