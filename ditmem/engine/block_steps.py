"""Block-level preemption for the engine: steps run as chunks of blocks, part-done steps
parked between chunks (``Engine(..., preemption="block")``).

The policy names the batch (and optionally ``plan.blocks``) at every chunk boundary. A
part-done step the plan leaves out is parked: its block-boundary activations, already in the
requests' pages, start moving to the host asynchronously (``ChunkRunner.park``) while the
plan's batch computes; their device pages free once the copy lands (``settle``). When the
plan runs the step again it is resumed (the copy cancelled if still in flight, else restored
into any free pages) and continues from its block. Statuses tell the policy
``blocks_done``, ``step_group`` and where the activations are.

A chunk of k blocks runs one block at a time on the open step (no boundary is written in
between, so this costs nothing); after each block ``interrupt(ids)`` is asked whether one of
the requests was cancelled or the engine is stopping, and the chunk ends there: a cancel
takes effect at the next block boundary, not after the whole step.
"""

from __future__ import annotations

from ditmem.memory import HostPoolExhausted
from ditmem.models.common.chunked import ChunkRunner, ParkedStep
from ditmem.scheduler import Location
from ditmem.scheduler.block_step import plan_chunk


class BlockSteps:
    """The executor's part for block preemption: chunk runs, parking, resuming."""

    def __init__(self, generator, offloader, clock, interrupt=None):
        self.gen = generator
        self.interrupt = interrupt  # ids -> bool; None: chunks always run whole
        self.runner = ChunkRunner(generator, offloader)
        self.clock = clock
        # group (sorted ids) -> its park, or None when the activations stayed in device
        # pages (no room on the host)
        self.parked: dict[tuple[str, ...], ParkedStep | None] = {}
        self.parks = 0

    def settle(self, active: dict) -> None:
        """Finish landed offloads: their device pages are free, activations on the host."""
        for group, parked in self.parked.items():
            if parked is not None and self.runner.settle(parked):
                for rid in group:
                    if rid in active:
                        active[rid].status.activations = Location.HOST

    def park_left_out(self, active: dict, batch: list[str], blocks: int | None = None) -> None:
        """Park every part-done step that ``batch`` does not continue (the simulator's rules:
        ``ditmem.scheduler.block_step.plan_chunk``, which raises ``BlockPlanError`` for a
        batch that splits a part-done step)."""
        members = [active[i].status for i in batch if i in active]
        statuses = [j.status for j in active.values()]
        to_park, _ = plan_chunk(statuses, members, self.parked, blocks)
        for group, parts in to_park:
            running = [active[s.id] for s in parts]
            try:
                parked = self.runner.park([j.state for j in running])
            except HostPoolExhausted:
                parked = None  # stays in its device pages until resumed
            self.parked[group] = parked
            self.parks += 1
            for j in running:
                j.status.activations = Location.DEVICE
                j.extra["parks"] = j.extra.get("parks", 0) + 1

    def resume(self, jobs: list) -> bool:
        """Make a parked step runnable again; False (nothing changed) when no room."""
        group = tuple(sorted(j.id for j in jobs))
        if group not in self.parked:
            return True
        parked = self.parked[group]
        if parked is not None and not self.runner.resume(parked):
            return False
        del self.parked[group]
        for j in jobs:
            j.status.activations = None
        return True

    def run(self, jobs: list, k: int) -> tuple[float, int]:
        """Run the next ``k`` blocks of the jobs' step; returns (seconds, blocks run). If
        the pool has no room for the boundary activations the whole rest of the step runs
        (nothing to keep between chunks then)."""
        states = [j.state for j in jobs]
        start = self.gen.block(states[0])
        t0 = self.clock()
        if not self._run_blocks(jobs, states, k):
            self.gen.step(states)
        dt = self.clock() - t0
        done = self.gen.block(states[0])
        group = tuple(sorted(j.id for j in jobs)) if done else ()
        for j in jobs:
            j.peak_pages = max(j.peak_pages, int(j.state.num_pages))
            j.timing.running_s += dt
            j.status.blocks_done = done
            j.status.step_group = group
            j.status.steps_done = self.gen.progress(j.state)[0]
            if done == 0:
                j.timing.steps_run += 1
        return dt, (done or self.gen.num_blocks) - start

    def _run_blocks(self, jobs: list, states: list, k: int) -> bool:
        """Up to ``k`` blocks, one at a time, stopping early when ``interrupt`` says so;
        False (nothing run) when the pool has no room for the boundary activations."""
        if self.interrupt is None:
            return self.runner.run_chunk(states, k)
        ids = [j.id for j in jobs]
        for i in range(k):
            if not self.runner.run_chunk(states, 1):
                return i > 0  # later blocks cannot fail for room: the step stays open
            if self.gen.block(states[0]) == 0 or self.interrupt(ids):
                return True
        return True

    def forget(self, job) -> None:
        """Before ``job``'s pages are freed: drop any park it belongs to (its partners keep
        their activations where they are and continue as a smaller group)."""
        for group in [g for g in self.parked if job.id in g]:
            parked = self.parked.pop(group)
            rest = tuple(g for g in group if g != job.id)
            if parked is None:
                if rest:
                    self.parked[rest] = None
                continue
            landed = parked.on_host
            states = [s for s in parked.states if s is not job.state]
            self.runner.drop(parked)  # an offload in flight is cancelled: data on the device
            if landed and rest:
                self.parked[rest] = ParkedStep(states, parked.block, None)
