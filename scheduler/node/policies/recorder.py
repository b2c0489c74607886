"""A node policy wrapper that logs its decisions, and where a request's time went.

``DecisionLog(policy, large)`` decides exactly as ``policy`` (it hands every call — decisions,
the split of a job's decodes, the loop's reports, cancellations — to it unchanged) and keeps,
per decision, who was running where and what the plan placed. ``time_split(log, records,
chosen)`` then splits each chosen request's latency by what it was doing between decisions:

* ``step d=k``: a job of one or more steps of it at degree k, not its last;
* ``last step + decode``: its last job (the last step and the decode that follows on one
  device of the group);
* ``wait (...)``: not running, with the node's devices held by the listed kinds of work —
  ``large decode`` (another large request's last job), ``large step``, ``small`` (any
  job of a request that is not large) — or ``wait (idle)`` when nothing ran.

A request is *large* when ``large(request)`` says so (the tool uses the largest tier, e.g.
1024² on the two-device demo). The split is by decision intervals (a job started at one
decision runs until a later one): exact for one-step jobs, which is what ``slo`` plans; a
static baseline's whole-request job (fifo) shows as one ``last step + decode``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ...request import Request
from ..plan import NodePlan, NodeView
from .base import NodePolicy


@dataclass(slots=True)
class Decision:
    """One decision: ``now`` (s); per request running or placed: (id, devices, last job?,
    large?); ``placed`` holds the ids this decision's plan placed."""

    now: float
    jobs: list[tuple[str, tuple[int, ...], bool, bool]] = field(default_factory=list)
    placed: set[str] = field(default_factory=set)


class DecisionLog(NodePolicy):
    """``policy`` with its decisions logged in ``log`` (see the module docstring)."""

    def __init__(self, policy: NodePolicy, large: Callable[[Request], bool]):
        super().__init__(policy.ncost, policy.node)
        self.policy = policy
        self.name = policy.name
        self.large = large
        self.log: list[Decision] = []
        self.split_yield = getattr(policy, "split_yield", False)

    def schedule(self, view: NodeView) -> NodePlan:
        plan = self.policy.schedule(view)
        d = Decision(view.now)
        for s in view.running:
            devices = s.group.devices if s.group is not None else ()
            d.jobs.append((s.id, tuple(devices), s.steps_left == 1, self.large(s.request)))
        paused = {s.id: s for s in view.paused}
        for a in plan.assignments:
            for rid in a.batch:
                s = paused.get(rid)
                req = s.request if s is not None else view.waiting.get(rid)
                left = s.steps_left if s is not None else req.steps
                d.jobs.append((rid, tuple(a.group.devices), left == a.steps, self.large(req)))
                d.placed.add(rid)
        self.log.append(d)
        return plan

    def split_decode(self, view: NodeView, plan: NodePlan, assignment) -> bool:
        return self.policy.split_decode(view, plan, assignment)

    def take_back(self, view: NodeView) -> list[int]:
        return self.policy.take_back(view)

    def observe(self, report) -> None:
        self.policy.observe(report)

    def forget(self, request_id: str) -> None:
        self.policy.forget(request_id)


def _state(d: Decision, rid: str) -> str:
    held: set[str] = set()
    for jid, devices, last, large in d.jobs:
        if jid == rid:
            return "last step + decode" if last else f"step d={len(devices)}"
        held.add(("large decode" if last else "large step") if large else "small")
    return f"wait ({', '.join(sorted(held))})" if held else "wait (idle)"


def time_split(log: list[Decision], records: Iterable, chosen: Callable,
               until: Callable | None = None) -> dict[str, dict]:
    """Per chosen record (``chosen(record)``): state → seconds (module docstring), from its
    arrival to its finish, or to ``until(record)`` when that is earlier (e.g. its deadline:
    what happened while it could still be met); without ``until`` the states of one request
    sum to its latency."""
    out: dict[str, dict[str, float]] = {}
    times = [d.now for d in log]
    for r in records:
        if not chosen(r):
            continue
        q, split = r.request, {}
        stop = r.finished if until is None else min(r.finished, until(r))
        for i, d in enumerate(log):
            end = times[i + 1] if i + 1 < len(log) else stop
            if end < q.arrival or d.now >= stop:
                continue
            lo, hi = max(d.now, q.arrival), min(end, stop)
            if hi > lo:
                key = _state(d, q.id)
                split[key] = split.get(key, 0.0) + hi - lo
        first = times[0] if times else r.finished
        if q.arrival < first:  # arrived before any decision: waited for the first one
            wait = min(first, stop) - q.arrival
            split["wait (idle)"] = split.get("wait (idle)", 0.0) + wait
        out[q.id] = split
    return out
