"""The stages the engine executes for a plan: encode, packed step, decode, offload, restore.

Each wraps one generator or offload-engine call with timing and an NVTX range, and updates
the job's ``Timing`` and scheduler ``RequestStatus``. Nothing here decides anything: the
policy chose the ids, the loop hands over the jobs.
"""

from __future__ import annotations

import logging

import numpy as np

from ditmem.engine.jobs import Job
from ditmem.engine.timing import StageTimer
from ditmem.engine.tracing import stage_range
from ditmem.memory import OffloadEngine, PagePool
from ditmem.models.common.tiled_decode import decode_job

log = logging.getLogger(__name__)
MIB = 2**20


def state_pages(state) -> int:
    """Pages a ``RequestState`` occupies (device or host, wherever it lives)."""
    return int(state.num_pages)


class Stages:
    """Executes stages for jobs on one generator, device pool and offload engine.

    ``clock`` returns seconds (float); CPU durations are differences of it, steps and
    decodes on CUDA/NPU are timed with device events (:class:`StageTimer`), transfers are
    charged the copy's own time (``TransferHandle.copy_s``), not the time spent waiting.
    ``decode_tile``: (tile, stride) pixels to decode in VAE tiles, or None (whole).
    """

    def __init__(self, generator, pool: PagePool, offloader: OffloadEngine, clock,
                 decode_tile: tuple[int, int] | None = None):
        self.gen = generator
        self.decode_tile = decode_tile
        self.pool = pool
        self.offloader = offloader
        self.clock = clock
        self.timer = StageTimer(pool.device, clock)

    def encode(self, job: Job) -> bool:
        """Encode ``job`` into fresh pages; False (nothing allocated) when there is no room."""
        t0 = self.clock()
        if job.timing.started is None:
            job.timing.started = t0
        with stage_range("encode", job.id):
            state = self.gen.encode(job.gen, self.pool)
        dt = self.clock() - t0
        job.timing.encode_s += dt
        job.timing.running_s += dt
        if state is None:
            log.debug("encode %s: no room in the pool (%.1f ms)", job.id, 1e3 * dt)
            return False
        log.debug("encode %s: %d pages, %.1f ms", job.id, state_pages(state), 1e3 * dt)
        job.state = state
        return True

    def step(self, jobs: list[Job]) -> float:
        """One packed denoising step over ``jobs``; returns its wall time in seconds."""
        with stage_range("step", f"batch={len(jobs)}"):
            _, dt = self.timer.time(lambda: self.gen.step([j.state for j in jobs]))
        log.debug("step [%s]: %.1f ms", ",".join(j.id for j in jobs), 1e3 * dt)
        for j in jobs:
            j.timing.running_s += dt
            j.timing.steps_run += 1
            j.status.steps_done = self.gen.progress(j.state)[0]
        return dt

    def is_done(self, job: Job) -> bool:
        return bool(self.gen.is_done(job.state))

    def decode(self, job: Job) -> np.ndarray:
        """VAE-decode a finished job: uint8 ``[H, W, 3]`` or ``[F, H, W, 3]``."""
        def run():
            if self.decode_tile is None:
                return self.gen.decode(job.state)
            work = decode_job(self.gen, job.state, *self.decode_tile)  # the tiled decode's
            while not work.done:                                       # tiles, back to back
                work.run_one()
            return work.output()

        with stage_range("decode", job.id):
            out, dt = self.timer.time(run)
        log.debug("decode %s: %.1f ms", job.id, 1e3 * dt)
        job.timing.decode_s += dt
        job.timing.running_s += dt
        return out

    def start_offload(self, job: Job):
        """Launch the copy of ``job``'s pages to the host; returns the transfer handle."""
        with stage_range("offload", job.id):
            return job.state.start_offload(self.offloader)

    def finish_offload(self, job: Job, handle) -> int:
        """Wait for an offload; the device pages are free afterwards. Returns bytes moved;
        the job is charged the copy's own time."""
        return self._finish_copy("offload", job, handle, self.offloader.finish_offload)

    def start_restore(self, job: Job):
        """Launch the copy of ``job``'s pages into free device pages: its handle, or None
        when the pool has no room (nothing changed). The pages are not to be read before
        :meth:`finish_restore`."""
        with stage_range("restore", job.id):
            return job.state.start_restore(self.offloader)

    def finish_restore(self, job: Job, handle) -> int:
        """Complete a restore (later device work waits for the copy); bytes moved. The job is
        charged the copy's own time."""
        return self._finish_copy("restore", job, handle, self.offloader.finish_restore)

    def _finish_copy(self, kind: str, job: Job, handle, finish) -> int:
        with stage_range(kind, job.id):
            finish(handle)
        job.timing.offload_s += handle.copy_s
        nbytes = handle.num_pages * self.pool.page_bytes
        log.debug("%s %s: %.1f MiB copied in %.2f ms", kind, job.id, nbytes / MIB,
                  1e3 * handle.copy_s)
        return nbytes

    def restore(self, job: Job) -> int | None:
        """:meth:`start_restore` + :meth:`finish_restore`; None when there is no room."""
        handle = self.start_restore(job)
        return None if handle is None else self.finish_restore(job, handle)

    def release(self, job: Job) -> None:
        """Free every page the job holds (device and host). Safe to call twice."""
        if job.state is not None:
            self.gen.release(job.state)
            job.state = None
