"""The device interface the node loop runs against, and its virtual implementation.

The loop (``ditmem.scheduler.node.simulator.run_node``) decides; devices execute. A ``Job``
is one group's work until its next decision point: moves of paused state (offloads from
the group's devices to the host, restores from the host, peer copies between groups),
encodes of admitted members (single-device, spread over the group's devices), ``steps``
denoising steps of one packed batch at the group's degree, and decodes of the members whose
last step it runs (single-device, spread likewise). ``NodeDevices`` is what an engine with
real devices implements (``launch`` hands a job to the group's workers, ``wait`` blocks for
the next completion or until a time); ``VirtualDevices`` draws every duration around the
node cost model with ``TimingNoise`` (the simulator's truth is not the policy's model).

Both execute a job with :func:`run_job`: the single-device loop's own order
(``ditmem.scheduler.loop.run_stages``) over the group's ``Stages`` (:class:`JobStages`), so
the node's order cannot drift from one device's. ``NodeDevices`` is the second, outer
interface only because a node runs jobs on several groups at once and hands completions
back as they come.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Protocol

from ..loop import Stages, run_stages
from ..noise import TimingNoise
from ..request import Request
from .cost import NodeCost
from .topology import Group


@dataclass(slots=True)
class Move:
    """Make ``request``'s state resident on ``dst`` (None: park it on the host) from ``src``
    (None: it is on the host)."""

    request: Request
    src: Group | None
    dst: Group | None


@dataclass(slots=True)
class Job:
    """One group's work until its next decision point (see the module docstring)."""

    job_id: int
    group: Group
    batch: list[Request]
    steps: int
    moves: list[Move] = field(default_factory=list)
    encodes: list[Request] = field(default_factory=list)
    decodes: list[Request] = field(default_factory=list)


@dataclass(slots=True)
class Timings:
    """Seconds a job spent per stage (transfers, encodes, steps, decodes)."""

    transfer_s: float = 0.0
    encode_s: float = 0.0
    step_s: float = 0.0
    decode_s: float = 0.0

    @property
    def total(self) -> float:
        return self.transfer_s + self.encode_s + self.step_s + self.decode_s


@dataclass(slots=True)
class Completion:
    job: Job
    started: float
    finished: float
    timings: Timings


class NodeDevices(Protocol):
    """What the node loop needs from the devices (virtual here, real in the node engine)."""

    def launch(self, job: Job, now: float) -> None:
        """Start ``job`` on its group at ``now`` (its devices are idle)."""

    def wait(self, until: float | None) -> list[Completion]:
        """The next job completions, all finishing at the same earliest time, if that is no
        later than ``until`` (None: wait for one); else an empty list."""


def spread(durations: list[float], devices: int) -> float:
    """Wall time of single-device stages spread round-robin over ``devices`` devices."""
    if len(durations) <= 1:
        return durations[0] if durations else 0.0
    loads = [0.0] * max(1, devices)
    for i, d in enumerate(durations):
        loads[i % len(loads)] += d
    return max(loads, default=0.0)


def run_job(job: Job, stages: Stages) -> None:
    """Execute ``job`` on ``stages`` (its group's, virtual or real) in the loop's order:
    ``ditmem.scheduler.loop.run_stages``, the single-device loop's own function. Its
    ``step`` returns the ids of ``job.decodes``."""
    run_stages(
        stages,
        offload=[mv.request.id for mv in job.moves if mv.dst is None],
        restore=[mv.request.id for mv in job.moves if mv.dst is not None],
        admit=[r.id for r in job.encodes],
        batch=[r.id for r in job.batch],
        steps=job.steps,
    )


class JobStages:
    """What every group's ``Stages`` for one job shares: the job, its ``Timings``, and its
    moves and requests by id. Transfers are synchronous (``finish_*`` do nothing)."""

    def __init__(self, job: Job):
        self.job = job
        self.timings = Timings()
        self.offloads = {mv.request.id: mv for mv in job.moves if mv.dst is None}
        self.restores = {mv.request.id: mv for mv in job.moves if mv.dst is not None}
        self.requests = {r.id: r for r in (*job.encodes, *job.batch)}

    def finish_offload(self, handle: object) -> None:
        """Nothing to wait for (the move ran in ``start_offload``)."""

    def finish_restore(self, handle: object) -> None:
        """Nothing to wait for (the move ran in ``start_restore``)."""


class _VirtualJob(JobStages):
    """One job on ``VirtualDevices``: every duration drawn around the truth."""

    def __init__(self, devices: VirtualDevices, job: Job):
        super().__init__(job)
        self.truth = devices.truth
        self.draw = devices.noise.draw

    def start_offload(self, rid: str) -> None:
        mv = self.offloads[rid]
        self.timings.transfer_s += self.draw(self.truth.offload_time(mv.request, mv.src))

    def start_restore(self, rid: str) -> None:
        mv = self.restores[rid]
        secs, _ = self.truth.move_time(mv.request, mv.src, mv.dst)
        self.timings.transfer_s += self.draw(secs)

    def encode(self, rids: list[str]) -> None:
        cost, draw = self.truth.cost, self.draw
        durations = [draw(cost.encode_time(self.requests[rid])) for rid in rids]
        self.timings.encode_s = spread(durations, self.job.group.degree)

    def step(self, rids: list[str], steps: int, blocks: int | None) -> list[str]:
        job, truth = self.job, self.truth
        if rids and steps:
            model = job.batch[0].model
            tokens = [truth.cost.tokens(r) for r in job.batch]
            step = truth.step_time(model, tokens, job.group.degree) / truth.correction(model)
            self.timings.step_s = sum(self.draw(step) for _ in range(steps))
        return [r.id for r in job.decodes]

    def decode(self, rids: list[str]) -> None:
        cost, draw = self.truth.cost, self.draw
        durations = [draw(cost.decode_time(r)) for r in self.job.decodes]
        self.timings.decode_s = spread(durations, self.job.group.degree)


class VirtualDevices:
    """Devices whose true times are drawn around ``truth`` (a NodeCost) with ``noise``."""

    def __init__(self, truth: NodeCost, noise: TimingNoise | None = None):
        self.truth = truth
        self.noise = noise if noise is not None else TimingNoise(sigma=0.0)
        self._heap: list[tuple[float, int, Completion]] = []
        self.link_busy_s = 0.0

    def timings(self, job: Job) -> Timings:
        stages = _VirtualJob(self, job)
        run_job(job, stages)
        self.link_busy_s += stages.timings.transfer_s
        return stages.timings

    def launch(self, job: Job, now: float) -> None:
        t = self.timings(job)
        done = Completion(job, now, now + t.total, t)
        heapq.heappush(self._heap, (done.finished, job.job_id, done))

    def wait(self, until: float | None) -> list[Completion]:
        if not self._heap or (until is not None and self._heap[0][0] > until):
            return []
        first = self._heap[0][0]
        out = []
        while self._heap and self._heap[0][0] == first:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def __len__(self) -> int:
        return len(self._heap)
