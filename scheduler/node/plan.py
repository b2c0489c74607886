"""What the node loop shows a policy, and what the policy answers.

A policy is asked whenever devices are idle and something changed (an arrival, a job's
end). It sees the started requests that are not running (``paused``: resident on a group or
parked on the host), the running ones (with the group and the predicted end of their job),
the waiting queue, the free-device mask and the pages free on each device. It also sees when
each device's current work ends (``busy_until``, as predicted): a paused request resident
on devices still running another job cannot be moved before that job's step ends. It
answers with ``Assignment``s — a batch for a free group, for ``steps`` steps — and the
loop derives the moves: a waiting member is admitted (pages on the group, encode), a
member resident elsewhere is migrated (peer copy / re-sharding, or restore from the
host), and the paused requests named in ``offload`` (resident on the group's devices) are
parked on the host first to make room.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..request import Request
from .topology import Group, Node

if TYPE_CHECKING:  # pragma: no cover
    from ..queue import WaitingQueue


@dataclass(slots=True)
class NodeStatus:
    """A started request on the node.

    ``group`` is where its state is resident (None: on the host); ``pages`` per device of
    the group, ``host_pages`` in the host pool while parked; ``running`` while a job
    holds it; ``degrees`` maps degree → steps run at it; ``last_end`` is when its last job
    ended (a later resume counts as a preemption).
    """

    request: Request
    steps_done: int = 0
    group: Group | None = None
    pages: int = 0
    host_pages: int = 0
    started_at: float = 0.0
    running: bool = False
    job_end: float = 0.0
    last_end: float = 0.0
    preemptions: int = 0
    migrations: int = 0
    offloads: int = 0
    degrees: dict[int, int] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def steps_left(self) -> int:
        return self.request.steps - self.steps_done

    @property
    def on_host(self) -> bool:
        return self.group is None


@dataclass(slots=True)
class SpareDevice:
    """A device working on another device's decode (a spare of a split decode,
    ``Job.split_decodes``), as the loop predicts it (absolute seconds, the policy's model):
    ``free_at`` when its tiles end, ``taken_free_at`` when it would be free if taken back
    now (the end of the tile it is in: ``NodeDevices.reclaim``); ``decode_end`` /
    ``taken_decode_end`` when the decode of ``request`` (on ``lane``) ends either way."""

    device: int
    job_id: int
    request: Request
    lane: int
    free_at: float
    taken_free_at: float
    decode_end: float
    taken_decode_end: float


@dataclass(slots=True)
class NodeView:
    """The snapshot a node policy decides on (see the module docstring)."""

    now: float
    node: Node
    free: int
    paused: list[NodeStatus]
    running: list[NodeStatus]
    waiting: WaitingQueue
    free_pages: list[int]
    host_free_pages: int
    page_bytes: int
    max_started: int | None
    #: Per device, when what it runs now ends as predicted (its job, or a move reading from
    #: it); ``now`` or earlier when idle. A move of paused state starts only when all its
    #: devices are free (``NodeCost.move_wait``). Missing entries: free.
    busy_until: list[float] = field(default_factory=list)
    #: Devices that may be taken back between the tiles of a split decode (none unless the
    #: loop asks ``take_back``).
    spares: list[SpareDevice] = field(default_factory=list)

    @property
    def started(self) -> int:
        return len(self.paused) + len(self.running)


@dataclass(slots=True)
class Assignment:
    """Run ``batch`` (ids; started or waiting; one model) on ``group`` for ``steps`` steps
    (every member must have that many left), parking ``offload`` (paused ids resident on the
    group's devices) on the host first."""

    group: Group
    batch: list[str]
    steps: int = 1
    offload: list[str] = field(default_factory=list)


@dataclass(slots=True)
class NodePlan:
    assignments: list[Assignment] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        return not self.assignments
