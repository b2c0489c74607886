"""Helpers for policies under block-level preemption: part-done steps in a view, and whether
parking the running one is worth it."""

from __future__ import annotations

from collections.abc import Iterable

from ..chunking import activation_bytes, remaining_step_time
from ..cost import CostModel
from ..plan import SchedulerView
from ..request import RequestStatus


def group_of(item, view: SchedulerView) -> list[RequestStatus]:
    """The members of ``item``'s part-done step (empty when it is between steps or is a
    waiting request)."""
    if not isinstance(item, RequestStatus) or item.blocks_done == 0:
        return []
    ids = set(item.step_group)
    return [s for s in view.active if s.id in ids]


def is_part_done(item) -> bool:
    """Whether ``item`` (RequestStatus or waiting Request) is paused inside a step."""
    return isinstance(item, RequestStatus) and item.blocks_done > 0


def running_step(view: SchedulerView) -> list[RequestStatus]:
    """The part-done step that ran in the last iteration (empty if none, or step mode)."""
    if view.preemption != "block":
        return []
    last = set(view.last_batch)
    return [s for s in view.active if s.blocks_done > 0 and s.id in last]


def can_park(cost: CostModel, view: SchedulerView, running: list[RequestStatus]) -> bool:
    """Whether the engine has room (device or host pages) for the step's activations."""
    mem = view.memory
    nbytes = activation_bytes(cost, [s.request for s in running])
    pages = -(-nbytes // mem.page_bytes)
    return pages <= mem.free_pages or pages <= mem.host_free_pages


def keep_running(
    cost: CostModel, view: SchedulerView, running: list[RequestStatus], before: Iterable[float]
) -> bool:
    """Finish the running part-done step unless that would take a request served before it
    past its slack (``before``: the slack, in seconds, of each request the policy would serve
    first) — or unless it cannot be parked at all."""
    if not can_park(cost, view, running):
        return True
    rest = remaining_step_time(cost, [s.request for s in running], running[0].blocks_done)
    return all(slack >= rest for slack in before)
