"""One engine iteration: build the policy's view, execute its plan, finish requests.

The plan runs through ``ditmem.scheduler.loop.run_stages`` (the simulator's order, written
once); :class:`PlanExecutor` is its real device (``start_offload`` ... ``decode``).

Runs on the engine thread only (no locks except through ``Intake``). An exception raised by
one request's stage fails that request alone: a failed packed step is retried request by
request so the others still advance (the generator writes nothing back when a step raises).
"""

from __future__ import annotations

import queue

from ditmem.engine.block_steps import BlockSteps
from ditmem.engine.decode_worker import DecodeWorkers
from ditmem.engine.jobs import Job, Phase
from ditmem.engine.results import GenerationResult, RequestCancelled, RequestFailed
from ditmem.engine.stages import Stages, state_pages
from ditmem.engine.stats import EngineStats
from ditmem.engine.tiled_decodes import TileRunner
from ditmem.memory import OffloadEngine
from ditmem.scheduler import (
    Location,
    MemoryState,
    RequestStatus,
    SchedulerView,
    StepReport,
    WaitingQueue,
)
from ditmem.scheduler.decode_lane import step_deadline
from ditmem.scheduler.loop import mid_step, preempted, run_stages


class PlanExecutor:
    """Owns the waiting queue and the active set of one :class:`Engine`."""

    def __init__(self, engine, offload_mode: str):
        self.engine = engine
        self.offloader = OffloadEngine(engine.pool, engine.host, mode=offload_mode)
        self.stages = Stages(engine.gen, engine.pool, self.offloader, engine.clock,
                             engine.decode_tile)
        self.blocks = (BlockSteps(engine.gen, self.offloader, engine.clock,
                                  engine.intake.wants_stop)
                       if engine.preemption == "block" else None)
        self.waiting = WaitingQueue()
        self.jobs: dict[str, Job] = {}       # waiting jobs by id
        self.active: dict[str, Job] = {}     # started jobs, in admission order
        self.last_batch: tuple[str, ...] = ()
        self.held: set[str] = set()          # ids the current iteration's plan names
        self._blocks_run: int | None = None
        self._report: StepReport | None = None  # the iteration's, while its stages run
        self._worked = False
        self._plan_first: set[str] = set()  # this iteration's plan.first_decodes
        self._carried: list = []  # those delivered since the last step's report (requests)
        self._carried_s = 0.0  # and their decode seconds
        self.stats = EngineStats()
        # decode off the step loop (worker threads, earliest deadline first), results handed
        # back through a queue
        workers = engine.decode_workers
        self.decoder = DecodeWorkers(workers) if workers else None
        self.decoding: dict[str, Job] = {}
        self.decoded: queue.SimpleQueue = queue.SimpleQueue()
        self.tiles = (TileRunner(engine.gen, engine.cost, engine.clock, *engine.decode_tile)
                      if engine.decode == "tiled" else None)

    def has_work(self) -> bool:
        return bool(self.jobs or self.active or self.decoding or self.tiles)

    # ------------------------------------------------------------------ intake
    def take_intake(self) -> None:
        while not self.decoded.empty():
            job, output, error = self.decoded.get()
            del self.decoding[job.id]
            if job.cancel_reason is not None:
                error = RequestCancelled(f"{job.id}: {job.cancel_reason}")
            self.finish(job, output=output, error=error)
        new, cancels = self.engine.intake.take()
        for job in new:
            self.jobs[job.id] = job
            self.waiting.push(job.sched)
        for job_id, reason in cancels:
            if job_id in self.decoding:  # finishes decoding first, then is dropped
                self.decoding[job_id].cancel_reason = reason
                continue
            job = self.jobs.get(job_id) or self.active.get(job_id)
            if job is None and self.tiles is not None:
                job = self.tiles.forget(job_id)
            if job is not None:
                self.finish(job, error=RequestCancelled(f"{job_id}: {reason}"))

    def view(self) -> SchedulerView:
        pool, host = self.engine.pool, self.engine.host
        memory = MemoryState(total_pages=pool.num_pages, free_pages=pool.num_free_pages,
                             page_bytes=pool.page_bytes, host_free_pages=host.num_free_pages)
        return SchedulerView(active=[j.status for j in self.active.values()],
                             waiting=self.waiting, memory=memory, last_batch=self.last_batch,
                             max_active=self.engine.max_active,
                             preemption=self.engine.preemption,
                             decodes=self.tiles.pending() if self.tiles is not None else ())

    # ------------------------------------------------------------------ one iteration
    def iterate(self) -> bool:
        """Run one iteration; False when nothing could be executed (the caller then waits
        briefly instead of spinning: e.g. an admit that found no room)."""
        self.take_intake()
        if not self.has_work():
            self.publish()
            return False
        if self.blocks is not None:
            self.blocks.settle(self.active)  # landed parks free their pages before the view
        t0 = self.engine.clock()
        self.held = set()
        plan = self.engine.policy.schedule(t0, self.view())
        self.held = {*plan.batch, *plan.admit, *plan.restore, *plan.offload}
        self.stats.schedule_s += self.engine.clock() - t0
        self.stats.iterations += 1
        if self.tiles is not None and not plan.hold_tiles and self._run_due_tile(plan):
            return True
        if plan.idle:
            self.publish()
            return False
        report = StepReport(now=self.engine.clock(), batch=[], model=self.engine.model,
                            tokens=[], step_s=0.0)
        self._report, self._worked = report, False
        self._plan_first = set(plan.first_decodes)
        moved = self.stats.bytes_offloaded + self.stats.bytes_restored
        run_stages(self, offload=plan.offload, restore=plan.restore, admit=plan.admit,
                   batch=plan.batch, blocks=plan.blocks)
        self._count_preemptions(report.batch)
        self.last_batch = tuple(report.batch)
        report.transfer_bytes = self.stats.bytes_offloaded + self.stats.bytes_restored - moved
        if self._carried:  # first-going tiled decodes delivered since: the policy learns them
            report.decoded += self._carried
            report.decode_s += self._carried_s
            self._carried, self._carried_s = [], 0.0
        observe = getattr(self.engine.policy, "observe", None)
        if observe is not None:
            observe(report)
        self.publish()
        return bool(self._worked or report.encode_s or report.transfer_s)

    # ------------------------------------------------------------------ the loop's stages
    # (``ditmem.scheduler.loop.Stages``: ``run_stages`` calls them in the loop's order)
    def start_offload(self, job_id: str):
        job = self.active.get(job_id)
        if job is None or job.status.location is not Location.DEVICE:
            return None
        self._worked = True
        return job, self.stages.start_offload(job)

    def finish_offload(self, handle) -> None:
        job, copy = handle
        self._report.transfer_s += self._finish_offload(job, copy)

    def start_restore(self, job_id: str):
        job = self.active.get(job_id)
        copy = None if job is None else self._start_restore(job)
        if copy is None:
            return None
        self._worked = True
        return job, copy

    def finish_restore(self, handle) -> None:
        job, copy = handle
        self._finish_restore(job, copy, self._report)

    def encode(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            self._admit(job_id, self._report)

    def step(self, job_ids: list[str], steps: int, blocks: int | None) -> list[str]:
        """One step (or chunk) of the plan's batch members that are on the device; the ids
        whose last step ran. With block preemption a part-done step the batch does not
        continue is parked first."""
        if self.blocks is not None:
            self.blocks.park_left_out(self.active, job_ids, blocks)
        batch = [self.active[i] for i in job_ids if i in self.active
                 and self.active[i].status.location is Location.DEVICE]
        if batch and self.blocks is not None and not self.blocks.resume(batch):
            batch = []  # no room to bring its activations back: the policy sees the pool
        if not batch:
            return []
        self._worked = True
        self.publish(stepping=[j.id for j in batch])  # live while the step runs
        stepped = self._step(batch, self._report, blocks)
        return [j.id for j in stepped if self.stages.is_done(j)]

    def decode(self, job_ids: list[str]) -> None:
        """Decode finished jobs: as tiles on the loop, on the decode thread, or inline."""
        report = self._report
        for job in [self.active[i] for i in job_ids]:
            if self.tiles is not None:
                self._decode_tiled(job, report)
            elif self.decoder is not None:
                self._decode_async(job, report)
            else:
                ok, output = self._attempt(job, "decode", self.stages.decode, job)
                if not ok:
                    continue
                report.decode_s += job.timing.decode_s
                report.decoded.append(job.sched)
                report.finished.append(job.id)
                self.finish(job, output=output)

    def fail_held(self, error_of) -> list[str]:
        """After an iteration raised: fail the jobs its plan named (``error_of(job_id)`` is
        the exception each future gets), releasing their pages. Returns their ids."""
        failed = []
        for job_id in sorted(self.held):
            job = self.active.get(job_id) or self.jobs.get(job_id)
            if job is not None and job.phase is not Phase.DONE:
                self.finish(job, error=error_of(job_id))
                failed.append(job_id)
        self.held = set()
        self.last_batch = tuple(i for i in self.last_batch if i in self.active)
        return failed

    def _attempt(self, job: Job, stage: str, fn, *args):
        """``(True, fn(*args))``; or, when it raises, ``(False, None)`` after failing ``job``
        alone (one request's failure is its own)."""
        try:
            return True, fn(*args)
        except Exception as exc:  # noqa: BLE001
            self.finish(job, error=RequestFailed(f"{job.id}: {stage} failed: {exc!r}"))
            return False, None

    def _finish_offload(self, job: Job, handle) -> float:
        """Finish an offload; returns the copy's own seconds (what the transfer cost)."""
        ok, nbytes = self._attempt(job, "offload", self.stages.finish_offload, job, handle)
        if not ok:
            return 0.0
        self.stats.bytes_offloaded += nbytes
        job.status.location = Location.HOST
        job.timing.offloads += 1
        return handle.copy_s

    def _start_restore(self, job: Job):
        """Launch a restore: its handle, or None (not on the host, no room, or failed)."""
        if job.status.location is not Location.HOST:
            return None
        return self._attempt(job, "restore", self.stages.start_restore, job)[1]

    def _finish_restore(self, job: Job, handle, report: StepReport) -> None:
        ok, nbytes = self._attempt(job, "restore", self.stages.finish_restore, job, handle)
        if not ok:
            return
        self.stats.bytes_restored += nbytes
        job.status.location = Location.DEVICE
        report.transfer_s += handle.copy_s

    def _admit(self, job_id: str, report: StepReport) -> None:
        job = self.jobs.get(job_id)
        if job is None or len(self.active) >= self.engine.max_active:
            return
        ran, ok = self._attempt(job, "encode", self.stages.encode, job)
        if not ran:
            return
        report.encode_s += job.timing.encode_s
        report.encoded.append(job.sched)  # what the cost model's encode correction compares
        if not ok:
            return  # no room: it stays waiting; the policy sees the pool as it is
        self.waiting.remove(job_id)
        del self.jobs[job_id]
        self.engine.intake.started()
        job.phase = Phase.ACTIVE
        job.status = RequestStatus(request=job.sched, pages=state_pages(job.state),
                                   started_at=job.timing.started)
        self.active[job_id] = job

    def _run(self, jobs: list[Job], blocks: int | None) -> float:
        """A whole step, or (block preemption) the next chunk of it."""
        if self.blocks is None:
            return self.stages.step(jobs)
        k = blocks or self.engine.policy.chunk_blocks([j.sched for j in jobs])
        seconds, self._blocks_run = self.blocks.run(jobs, k)
        return seconds

    def _step(self, batch: list[Job], report: StepReport,
              blocks: int | None = None) -> list[Job]:
        """Run the batch's step; a failed step is retried request by request (the failed
        ones finish with their error). Returns the jobs that stepped."""
        self._blocks_run = None
        try:
            seconds = self._run(batch, blocks)
            stepped = batch
        except Exception:  # noqa: BLE001 - find who failed, advance the others
            stepped, seconds = [], 0.0
            for job in batch:
                ok, alone = self._attempt(job, "step", self._run, [job], blocks)
                if ok:
                    seconds += alone
                    stepped.append(job)
        self.stats.steps += 1
        report.batch = [j.id for j in stepped]
        report.tokens = [self.engine.cost.tokens(j.sched) for j in stepped]
        report.step_s = seconds
        report.blocks = self._blocks_run
        self.engine._notify_step(seconds, len(stepped))
        return stepped

    def _decode_tiled(self, job: Job, report: StepReport) -> None:
        """Queue a finished job's decode as tiles; it keeps its pages until delivered. A job
        the plan lists in ``first_decodes`` has its tiles run before any step the policy
        does not hold them for (``TiledDecodes.pick``)."""
        del self.active[job.id]
        report.finished.append(job.id)
        self._attempt(job, "decode", self.tiles.start, job, job.id in self._plan_first)

    def _run_tile(self, job_id: str) -> bool | None:
        """Run the next decode tile of ``job_id``: None while tiles remain; True when that was
        its last and the job is delivered; False when the tile raised and the job failed."""
        first = self.tiles.goes_first(job_id)
        job, output, error = self.tiles.run(job_id)
        if error is not None:
            self.finish(job, error=RequestFailed(f"{job_id}: decode failed: {error!r}"))
            return False
        if output is None:
            return None
        if first:
            self._carried.append(job.sched)
            self._carried_s += job.timing.decode_s
        self.finish(job, output=output)
        return True

    def _run_due_tile(self, plan) -> bool:
        """Run one decode tile instead of ``plan`` when a decode is due first, or a late
        decode's tile fits in the time the plan spares it (``plan.late_tiles_s``)."""
        last = [j.status if (j := self.active.get(i)) else None for i in self.last_batch]
        if mid_step(last):
            return False  # a part-done chunked step finishes before any tile
        deadlines = [(self.active.get(i) or self.jobs[i]).sched.deadline for i in plan.batch
                     if i in self.active or i in self.jobs]
        now = self.engine.clock()
        job_id = self.tiles.pick(now, step_deadline(now, deadlines), plan.late_tiles_s,
                                 plan.yield_s)
        if job_id is None:
            return False
        self._run_tile(job_id)
        self.last_batch = ()
        self.publish()
        return True

    def _decode_async(self, job: Job, report: StepReport) -> None:
        """Hand a finished job to the decode thread; it keeps its pages until delivered."""
        del self.active[job.id]
        self.decoding[job.id] = job
        report.finished.append(job.id)
        intake = self.engine.intake

        def run():
            try:
                out, err = self.stages.decode(job), None
            except Exception as exc:  # noqa: BLE001
                out, err = None, RequestFailed(f"{job.id}: decode failed: {exc!r}")
            self.decoded.put((job, out, err))
            intake.signal()

        self.decoder.submit(job.sched.deadline, run)

    def _count_preemptions(self, stepped: list[str]) -> None:
        """Count the preemptions of this iteration (``scheduler.loop.preempted``)."""
        for job_id in preempted(self.last_batch, stepped, self.active):
            job = self.active[job_id]
            job.status.preemptions += 1
            job.timing.preemptions += 1
            self.stats.preemptions += 1

    # ------------------------------------------------------------------ finishing
    def finish(self, job: Job, *, output=None, error: Exception | None = None) -> None:
        """Release the job's pages, deliver its result or error, forget it."""
        started = job.phase is Phase.ACTIVE
        if job.state is not None:
            job.peak_pages = max(job.peak_pages, job.pages_needed, state_pages(job.state))
        if self.blocks is not None:
            self.blocks.forget(job)
        self.stages.release(job)
        if job.id in self.jobs:
            self.waiting.remove(job.id)
            del self.jobs[job.id]
        self.active.pop(job.id, None)
        job.phase = Phase.DONE
        job.timing.finished = self.engine.clock()
        self.engine.intake.forget(job, started=started)
        if self.engine._exact is not None:
            self.engine._exact.forget(job.id)
        if error is None:
            result = GenerationResult(job.id, job.sched.priority, job.ticket.slo_ms,
                                      job.timing, output,
                                      job.peak_pages * self.engine.pool.page_bytes)
            self.stats.completed += 1
            met = self.stats.slo_met if result.slo_met else self.stats.slo_missed
            met[job.sched.priority] += 1
            self.engine._notify_finish(result)
            job.ticket.future.set_result(result)
        else:
            cancelled = isinstance(error, RequestCancelled)
            if cancelled:
                self.stats.cancelled += 1
            else:
                self.stats.failed += 1
            job.ticket.future.set_exception(error)

    def publish(self, stepping: list[str] | None = None) -> None:
        """Hand the stats to other threads; ``stepping``: the batch about to run (counted
        as running; else the last batch)."""
        s = self.stats.copy()
        running = self.last_batch if stepping is None else stepping
        s.running = sum(1 for j in self.active.values() if j.id in running)
        s.running += len(self.decoding)
        s.paused = sum(1 for j in self.active.values() if j.id not in running)
        s.offloaded = sum(1 for j in self.active.values() if j.status.location is Location.HOST)
        s.pages_used = self.engine.pool.num_used_pages
        s.pages_free = self.engine.pool.num_free_pages
        s.host_pages_used = self.engine.host.num_used_pages
        self.engine.intake.publish(s)

    def close(self) -> None:
        if self.decoder is not None:
            self.decoder.shutdown(wait=True)
        self.publish()
        self.offloader.close()
