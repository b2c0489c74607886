"""Decodes that run tile by tile on the step loop (``Engine(decode="tiled")``).

A request whose last step is done gets a tiled decode job (``ditmem.models.common.tiled_decode``)
and keeps its pages until the job is done. Before each iteration's plan the executor asks
:meth:`TileRunner.pick` whether a decode tile should run instead: the same rule the
simulator uses (``ditmem.scheduler.decode_lane.TiledDecodes``), with the cost model's
per-tile estimates (equal shares of its decode time when its tile geometry differs).
"""

from __future__ import annotations

from ditmem.engine.jobs import Job
from ditmem.engine.tracing import stage_range
from ditmem.models.common.tiled_decode import decode_job
from ditmem.scheduler.decode_lane import TiledDecodes
from ditmem.scheduler.plan import PendingDecode


class TileRunner:
    """The pending tiled decodes of one engine."""

    def __init__(self, gen, cost, clock, tile_px: int, stride_px: int):
        self.gen, self.cost, self.clock = gen, cost, clock
        self.tile_px, self.stride_px = tile_px, stride_px
        self._order = TiledDecodes()
        self._jobs: dict[str, tuple[Job, object]] = {}
        self.tiles_run = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._jobs

    def start(self, job: Job, first: bool = False) -> None:
        """Queue the decode of ``job`` (its last step is done); ``first``: its tiles go
        before any step the plan does not hold them for (``TiledDecodes.push``). Raises what
        the model's decode job raises (the caller fails that request)."""
        work = decode_job(self.gen, job.state, self.tile_px, self.stride_px)
        tiles = self.cost.decode_tiles(job.sched)
        if len(tiles) != work.units:  # the profile's tile geometry is not the engine's
            tiles = [sum(tiles) / work.units] * work.units
        self._order.push(job.id, job.sched.deadline, tiles, first)
        self._jobs[job.id] = (job, work)

    def pending(self) -> tuple:
        """The pending decodes as the policy sees them (``PendingDecode``), earliest deadline
        first."""
        return tuple(PendingDecode(self._jobs[rid][0].sched, left, n)
                     for rid, left, n in self._order.pending())

    def pick(self, now: float, deadline: float | None, spare: float = 0.0,
             yield_s: float = 0.0) -> str | None:
        """The request whose next tile runs instead of a step due at ``deadline`` (None:
        no step planned), or None; ``spare``: the seconds the plan grants late decodes
        (``StepPlan.late_tiles_s``); ``yield_s``: those the first decodes may yield
        (``StepPlan.yield_s``)."""
        return self._order.pick(now, deadline, spare, yield_s)

    def run(self, job_id: str):
        """Decode the next tile of ``job_id``: ``(job, output, error)``; output is None until
        the last tile is done; on an error the decode is forgotten (the caller fails it)."""
        job, work = self._jobs[job_id]
        t0 = self.clock()
        try:
            with stage_range("decode", job.id):
                work.run_one()
                output = work.output() if work.done else None
        except Exception as exc:  # noqa: BLE001 - one request's failure is its own
            self.forget(job_id)
            return job, None, exc
        finally:
            dt = self.clock() - t0
            job.timing.decode_s += dt
            job.timing.running_s += dt
            self.tiles_run += 1
        self._order.run_one(job_id)
        if output is not None:
            del self._jobs[job_id]
        return job, output, None

    def goes_first(self, job_id: str) -> bool:
        """Does the pending decode of ``job_id`` go first (``TiledDecodes.goes_first``)?"""
        return self._order.goes_first(job_id)

    def forget(self, job_id: str) -> Job | None:
        """Drop a pending decode (cancelled or failed); returns its job."""
        entry = self._jobs.pop(job_id, None)
        if entry is None:
            return None
        self._order.remove(job_id)
        return entry[0]
