"""The node engine behind the scheduler's device interface: real devices for
``ditmem.scheduler.node.simulator.run_node``.

``run_node`` decides (policy, page accounting, plan checks) and hands each group a
``Job``; :class:`EngineDevices` runs it on the :class:`~ditmem.parallel.node.NodeEngine`'s
workers in a thread of its own (jobs on disjoint groups run at once) in the loop's order:
moves (park on the host, restore from it onto any group, re-shard between groups over the
device link), encodes (single-device, spread round-robin over the group, then re-sharded
onto the whole group), ``steps`` packed steps at the group's degree, decodes (spread over
the group's devices). ``wait`` hands completions back in wall time since the start, so the
same loop that drives the simulator's virtual devices replays a trace in real time.

A job that fails (a lost device, a pool without room) still completes, so the loop never
waits forever; its error is recorded in :attr:`EngineDevices.errors`, its requests in
:attr:`EngineDevices.failed`, and their pages are released.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from ditmem.scheduler.node.device import Completion, Job, JobStages, Timings, run_job

log = logging.getLogger(__name__)


def _spread(items: list, devices: tuple[int, ...], fn: Callable) -> None:
    """``fn(item, device)`` for every item, round-robin over ``devices``, one thread per
    device (items on one device run in order)."""
    lanes = {d: items[i::len(devices)] for i, d in enumerate(devices)}
    errors: list[BaseException] = []

    def lane(d: int) -> None:
        try:
            for item in lanes[d]:
                fn(item, d)
        except BaseException as exc:  # re-raised below, in the job's thread
            errors.append(exc)

    threads = [threading.Thread(target=lane, args=(d,)) for d in devices if lanes[d]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class EngineDevices:
    """``NodeDevices`` on a ``NodeEngine`` (see module docstring).

    to_generation: scheduler ``Request`` -> ``GenerationRequest`` (its ``request_id`` must
    be the request's id); keep_outputs: keep every decoded image in :attr:`outputs`;
    decode_tile: ``(tile_px, stride_px)`` to decode with the VAE's tiled decode (as the
    profile's ``decode_tile_*`` prices it), ``None`` for whole decodes.
    """

    def __init__(self, node, to_generation: Callable, *, keep_outputs: bool = False,
                 decode_tile: tuple[int, int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
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
        self._done: queue.Queue[Completion] = queue.Queue()
        self._lock = threading.Lock()

    def now(self) -> float:
        """Seconds since the devices were created (the loop's time axis)."""
        return self.clock() - self.t0

    def launch(self, job: Job, now: float) -> None:
        threading.Thread(target=self._run, args=(job, now), name=f"ditmem-job-{job.job_id}",
                         daemon=True).start()

    def wait(self, until: float | None) -> list[Completion]:
        timeout = None if until is None else max(0.0, until - self.now())
        try:
            first = self._done.get(timeout=timeout)
        except queue.Empty:
            return []
        return [first]

    # ------------------------------------------------------------------ one job
    def _run(self, job: Job, started: float) -> None:
        t = Timings()
        try:
            self._execute(job, t)
        except Exception as exc:  # the loop must see the job end; the error is kept
            msg = f"job {job.job_id} on group {job.group}: {type(exc).__name__}: {exc}"
            log.error(msg)
            with self._lock:
                self.errors.append(msg)
                self.failed.update(r.id for r in job.batch)
            for r in job.batch:  # a failed request holds no pages (later jobs fail fast)
                try:
                    self.node.release(r.id)
                except Exception as cleanup:  # a lost device: nothing to free there
                    log.debug("release of %s after a failed job: %s", r.id, cleanup)
        self._done.put(Completion(job, started, self.now(), t))

    def _execute(self, job: Job, t: Timings) -> None:
        stages = _GroupJob(self, job, t)
        run_job(job, stages)


class _GroupJob(JobStages):
    """One job on the node engine's group (``run_job`` calls its stages in the loop's
    order); ``timings`` is the job's, filled as each stage ends."""

    def __init__(self, devices: EngineDevices, job: Job, timings: Timings) -> None:
        super().__init__(job)
        self.devices = devices
        self.node = devices.node
        self.clock = devices.clock
        self.group = tuple(job.group.devices)
        self.timings = timings

    def _moved(self, mark: float) -> None:
        seconds = self.clock() - mark
        self.timings.transfer_s += seconds
        with self.devices._lock:
            self.devices.link_busy_s += seconds

    def start_offload(self, rid: str) -> None:
        mark = self.clock()
        self.node.park(rid)
        self._moved(mark)

    def start_restore(self, rid: str) -> None:
        mv, mark = self.restores[rid], self.clock()
        if mv.src is None:
            if not self.node.resume(rid, tuple(mv.dst.devices)):
                raise MemoryError(f"resume of {rid} onto {mv.dst}: no room")
        else:
            self.node.move(rid, tuple(mv.dst.devices))
        self._moved(mark)

    def encode(self, rids: list[str]) -> None:
        node, devices, mark = self.node, self.group, self.clock()

        def encode(request, device: int) -> None:
            if not node.encode(self.devices.to_generation(request), device):
                raise MemoryError(f"encode of {request.id} on device {device}: no room")
            node.move(request.id, devices)  # onto the whole group (no-op at degree 1)

        _spread([self.requests[rid] for rid in rids], devices, encode)
        self.timings.encode_s = self.clock() - mark

    def step(self, rids: list[str], steps: int, blocks: int | None) -> list[str]:
        mark = self.clock()
        for _ in range(steps if rids else 0):
            self.node.step([(self.group, list(rids))])
        self.timings.step_s = self.clock() - mark
        return [r.id for r in self.job.decodes]

    def decode(self, rids: list[str]) -> None:
        owner, node, mark = self.devices, self.node, self.clock()

        def decode(request, device: int) -> None:
            node.move(request.id, (device,))
            image = node.decode(request.id, owner.decode_tile)
            node.release(request.id)
            if owner.keep_outputs:
                with owner._lock:
                    owner.outputs[request.id] = image

        _spread(list(self.job.decodes), self.group, decode)
        self.timings.decode_s = self.clock() - mark
