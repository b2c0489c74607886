"""One device worker: a process that owns one device, its page pool and offload engine,
joins the node's process groups once at start, and executes the engine's commands
(:mod:`ditmem.parallel.commands`) one at a time.

On CPU a "device" is this process pinned to one core (``torch`` with one thread); on
CUDA / NPU it is ``cuda:<index>`` / ``npu:<index>``. A step at degree 1 is the generator's
own packed step; at degree ``d > 1`` (Qwen-Image, Wan) it is the sequence-parallel packed
step of :mod:`ditmem.parallel.sp_step` over the group's process group, with each device
holding its token shard of the latents (and Wan's solver history) and updating only those
rows.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np
import torch

from ditmem.parallel import commands as cmd
from ditmem.parallel import state_moves
from ditmem.parallel.groups import close_node, init_node
from ditmem.parallel.token_rows import TokenRows, rows_of

log = logging.getLogger(__name__)


@dataclass(slots=True)
class WorkerConfig:
    """How every worker of a node is built (the same for all)."""

    model: str
    num_devices: int
    port: int
    device_type: str = "cpu"
    pool_pages: int = 1024
    page_bytes: int = 1 << 16
    model_kwargs: dict | None = None
    threads: int = 1
    collective_timeout_s: float = 120.0


@dataclass(slots=True)
class Part:
    """This device's part of a request: its state and the devices of its group."""

    state: object
    devices: tuple[int, ...]


def device_of(device_type: str, index: int) -> torch.device:
    return torch.device("cpu") if device_type == "cpu" else torch.device(device_type, index)


class DeviceWorker:
    """The command handlers of one worker (see module docstring)."""

    def __init__(self, index: int, generator, pool, hosts, offload, groups) -> None:
        self.index = index
        self.gen = generator
        self.pool = pool
        self.hosts = hosts
        self.host = hosts[index]
        self.offloader = offload
        self.groups = groups
        self.held: dict[str, Part] = {}
        self.parked: dict[str, Part] = {}
        #: split decodes started here (``ShareLatent``) until their ``BlendTiles``
        self.decoding: dict[str, object] = {}
        try:
            self.layout = rows_of(generator)
        except ValueError:  # this model's states never shard: check_degree refuses d > 1
            self.layout = TokenRows(())

    # ------------------------------------------------------------------ dispatch
    def handle(self, command) -> cmd.Reply:
        start, cpu, proc = time.perf_counter(), time.thread_time(), time.process_time()
        try:
            handler = getattr(self, "_" + type(command).__name__.lower())
            value = handler(command)
            ok, error = True, ""
        except Exception as exc:  # the engine decides what a failed command means
            log.debug("device %d: %s failed", self.index, type(command).__name__,
                      exc_info=True)
            value, ok = None, False
            error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
        return cmd.Reply(self.index, ok, value, error, time.perf_counter() - start,
                         self.pool.num_used_pages, time.thread_time() - cpu,
                         time.process_time() - proc, start,
                         {rid: self._pages_of(rid) for rid in _named(command)})

    def _pages_of(self, request_id: str) -> int:
        """Pages (device or host) this device holds for ``request_id``."""
        return sum(int(table[request_id].state.num_pages)
                   for table in (self.held, self.parked) if request_id in table)

    def _part(self, request_id: str) -> Part:
        try:
            return self.held[request_id]
        except KeyError:
            raise KeyError(f"device {self.index} holds no part of {request_id!r}") from None

    # ------------------------------------------------------------------ commands
    def _encode(self, c: cmd.Encode) -> bool:
        rid = c.request.request_id
        if not rid or rid in self.held or rid in self.parked:
            raise ValueError(f"encode: request_id {rid!r} is empty or already held")
        state = self.gen.encode(c.request, self.pool)
        if state is None:
            return False
        self.held[rid] = Part(state, (self.index,))
        return True

    def _step(self, c: cmd.Step) -> int:
        parts = [self._part(r) for r in c.request_ids]
        for r, p in zip(c.request_ids, parts, strict=True):
            if p.devices != c.devices:
                raise ValueError(f"step: {r} is held on devices {p.devices}, the step runs on "
                                 f"{c.devices}")
        states = [p.state for p in parts]
        if len(c.devices) == 1:
            self.gen.step(states)
        else:
            from ditmem.parallel.sp_step import sharded_step

            sharded_step(self.gen, states, self.groups[c.devices], c.devices.index(self.index),
                         len(c.devices))
        return len(states)

    def _reshard(self, c: cmd.Reshard) -> bool:
        state_moves.check_degree(self.gen, len(c.new))  # every member refuses alike
        part = self.held.get(c.request_id) if self.index in c.old else None
        if self.index in c.old and part is None:
            raise KeyError(f"reshard: device {self.index} holds no part of {c.request_id!r}")
        state = None if part is None else part.state
        if c.cover is None:
            fresh = state_moves.reshard(state, self.index, c.old, c.new, self.pool,
                                        c.request_id, self.layout)
        else:
            fresh = state_moves.reshard_over_group(state, self.groups[c.cover], c.cover,
                                                   self.index, c.old, c.new, self.pool,
                                                   c.request_id, self.layout)
        self.held.pop(c.request_id, None)
        if fresh is not None:
            self.held[c.request_id] = Part(fresh, c.new)
        return fresh is not None

    def _offload(self, c: cmd.Offload) -> state_moves.HostCopy:
        part = self._part(c.request_id)
        part.state.offload(self.offloader)
        del self.held[c.request_id]
        self.parked[c.request_id] = part
        return state_moves.host_copy(part.state, self.index, part.devices.index(self.index),
                                     len(part.devices))

    def _adopt(self, c: cmd.Adopt) -> bool:
        if c.request_id in self.held:
            raise ValueError(f"adopt: device {self.index} already holds {c.request_id!r}")
        state_moves.check_degree(self.gen, len(c.devices))
        state = state_moves.adopt(c.parts, self.hosts, self.pool, c.devices.index(self.index),
                                  len(c.devices), c.request_id, self.pool.device, self.layout)
        if state is None:
            return False
        self.held[c.request_id] = Part(state, c.devices)
        return True

    def _drophost(self, c: cmd.DropHost) -> None:
        part = self.parked.pop(c.request_id, None)
        if part is not None:
            part.state.free()

    def _decode(self, c: cmd.Decode) -> cmd.SharedImage:
        part = self._part(c.request_id)
        if len(part.devices) != 1:
            raise ValueError(f"decode: {c.request_id} is held at degree {len(part.devices)}; "
                             "move it to one device first")
        from ditmem.models.common.tiled_decode import decode_job, supports_tiled_decode

        if c.tile is not None and supports_tiled_decode(self.gen):
            job = decode_job(self.gen, part.state, *c.tile)
            while not job.done:
                job.run_one()
            image = job.output()
        else:
            image = self.gen.decode(part.state)
        return _share_image(image)

    def _sharelatent(self, c: cmd.ShareLatent) -> tuple[cmd.SharedTensor, int]:
        part = self._part(c.request_id)
        if len(part.devices) != 1:
            raise ValueError(f"share latent: {c.request_id} is held at degree "
                             f"{len(part.devices)}; move it to one device first")
        from ditmem.models.common.tiled_decode import decode_job

        job = decode_job(self.gen, part.state, *c.tile)
        if not hasattr(job, "put"):
            raise TypeError(f"{type(job).__name__} cannot split a decode over devices")
        self.decoding[c.request_id] = job
        return to_shared(job.latent), job.units

    def _decodetiles(self, c: cmd.DecodeTiles) -> list[cmd.SharedTensor]:
        if c.latent is None:
            job = self.decoding.get(c.request_id)
            if job is None:
                raise KeyError(f"decode tiles: no decode of {c.request_id!r} started on "
                               f"device {self.index}")
            for k in c.indices:
                job.put(k, job.decode_tile(k))
            return []
        from ditmem.models.common.tiled_decode import QwenDecodeJob, supports_tiled_decode

        if not supports_tiled_decode(self.gen):
            raise TypeError(f"{type(self.gen).__name__} cannot split a decode over devices")
        job = QwenDecodeJob(self.gen, None, *c.tile,
                            latent=from_shared(c.latent).to(self.pool.device))
        out: list[cmd.SharedTensor] = []
        try:
            for k in c.indices:
                out.append(to_shared(job.decode_tile(k)))
        except BaseException:  # the engine never learns these names: unlink them here
            for ref in out:
                unlink_shared(ref.name)
            raise
        return out

    def _blendtiles(self, c: cmd.BlendTiles) -> cmd.SharedImage:
        job = self.decoding.pop(c.request_id, None)
        if job is None:
            raise KeyError(f"blend: no decode of {c.request_id!r} started on device "
                           f"{self.index}")
        device = job.latent.device
        for k, ref in c.tiles.items():
            job.put(k, from_shared(ref).to(device))
        return _share_image(job.output())

    def _release(self, c: cmd.Release) -> None:
        self.decoding.pop(c.request_id, None)
        for table in (self.held, self.parked):
            part = table.pop(c.request_id, None)
            if part is not None:
                part.state.free()

    def _linkprobe(self, c: cmd.LinkProbe) -> float:
        import statistics

        import torch.distributed as dist

        group = self.groups[c.devices]
        buf = torch.ones(c.nbytes, dtype=torch.uint8, device=self.pool.device)
        times = []
        for _ in range(c.repeats + 1):  # the first one warms the pairs up
            dist.barrier(group=group)
            t0 = time.perf_counter()
            dist.broadcast(buf, src=c.devices[0], group=group)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    def _stats(self, c: cmd.Stats) -> cmd.DeviceStats:
        return cmd.DeviceStats(self.index, self.pool.num_used_pages, self.host.num_used_pages,
                               sorted(self.held), sorted(self.parked))


def _share_image(image: np.ndarray) -> cmd.SharedImage:
    """``image`` copied into a new shared-memory segment (the engine unlinks it)."""
    image = np.ascontiguousarray(image)
    segment = shared_memory.SharedMemory(create=True, size=max(1, image.nbytes))
    np.ndarray(image.shape, image.dtype, buffer=segment.buf)[...] = image
    out = cmd.SharedImage(segment.name, image.shape, str(image.dtype))
    segment.close()  # the engine unlinks it once copied
    return out


def to_shared(tensor: torch.Tensor) -> cmd.SharedTensor:
    """``tensor`` copied to a new shared-memory segment on the host (whoever reads it
    last unlinks it: the engine, once the command that reads it has replied)."""
    flat = tensor.detach().contiguous().reshape(-1)
    nbytes = flat.numel() * flat.element_size()
    segment = shared_memory.SharedMemory(create=True, size=max(1, nbytes))
    try:
        if nbytes:
            torch.frombuffer(segment.buf, dtype=flat.dtype, count=flat.numel()).copy_(flat)
        return cmd.SharedTensor(segment.name, tuple(tensor.shape),
                                str(tensor.dtype).removeprefix("torch."))
    except BaseException:
        segment.unlink()
        raise
    finally:
        segment.close()


def from_shared(ref: cmd.SharedTensor) -> torch.Tensor:
    """A host copy of the tensor in segment ``ref`` (the segment is left in place)."""
    dtype = getattr(torch, ref.dtype)
    count = int(np.prod(ref.shape, dtype=np.int64))
    segment = shared_memory.SharedMemory(name=ref.name)
    try:
        if not count:
            return torch.empty(ref.shape, dtype=dtype)
        return torch.frombuffer(segment.buf, dtype=dtype, count=count).clone().view(ref.shape)
    finally:
        segment.close()


def unlink_shared(name: str) -> None:
    """Remove shared-memory segment ``name`` (nothing if it is already gone)."""
    try:
        segment = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return
    segment.close()
    segment.unlink()


def _named(command) -> list[str]:
    """The request ids a command names."""
    if isinstance(command, cmd.Step):
        return list(command.request_ids)
    if isinstance(command, cmd.Encode):
        return [command.request.request_id] if command.request.request_id else []
    rid = getattr(command, "request_id", None)
    return [rid] if isinstance(rid, str) else []


def _pin(index: int) -> None:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[index % len(cores)]})


def worker_main(index: int, config: WorkerConfig, hosts, conn) -> None:
    """Entry point of worker ``index`` (spawned by the node engine): build everything, say
    ready, then serve commands from ``conn`` until :class:`~commands.Stop`."""
    import ditmem.models as dm
    from ditmem.memory import OffloadEngine, PagePool

    try:
        if config.device_type == "cpu":
            _pin(index)
        torch.set_num_threads(config.threads)
        device = device_of(config.device_type, index)
        if device.type != "cpu":
            getattr(torch, device.type).set_device(device)
        groups = init_node(index, config.num_devices, config.port, config.device_type,
                           config.collective_timeout_s)
        gen = dm.load(config.model, device=device, **(config.model_kwargs or {}))
        pool = PagePool(config.pool_pages, config.page_bytes, device)
        worker = DeviceWorker(index, gen, pool, hosts, OffloadEngine(pool, hosts[index]),
                              groups)
    except Exception as exc:
        conn.send(cmd.Reply(index, False, error=f"start failed: {type(exc).__name__}: {exc}"))
        return
    conn.send(cmd.Reply(index, True, value=os.getpid()))
    try:
        while True:
            command = conn.recv()
            if isinstance(command, cmd.Stop):
                break
            conn.send(worker.handle(command))
    except (EOFError, KeyboardInterrupt):  # the engine went away
        pass
    finally:
        close_node()
