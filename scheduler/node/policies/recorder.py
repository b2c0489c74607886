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

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ...request import Request
from ..plan import NodePlan, NodeView
from .base import NodePolicy


@dataclass(slots=True)
class Decision:
    """One decision: ``now`` (s); per request running or placed: (id, devices, last job?,
    large?); ``placed`` holds the ids this decision's plan placed; ``late``: the ids the
    policy counted late in it (its ``late_ids()``, where it has one); ``waiting`` /
    ``paused``: the ids not running then (waiting: the first ``WAITING_KEPT`` by arrival)."""

    now: float
    jobs: list[tuple[str, tuple[int, ...], bool, bool]] = field(default_factory=list)
    placed: set[str] = field(default_factory=set)
    late: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    paused: tuple[str, ...] = ()


@dataclass(slots=True)
class TakeBack:
    """One ``take_back`` the loop asked for at ``now`` (s): the spares offered, as
    (device, id of the request whose split decode holds it), and the devices granted."""

    now: float
    offered: tuple[tuple[int, str], ...]
    granted: tuple[int, ...]


#: how many waiting ids (by arrival) a ``Decision`` keeps
WAITING_KEPT = 32


class DecisionLog(NodePolicy):
    """``policy`` with its decisions logged in ``log`` (see the module docstring)."""

    def __init__(self, policy: NodePolicy, large: Callable[[Request], bool]):
        super().__init__(policy.ncost, policy.node)
        self.policy = policy
        self.name = policy.name
        self.large = large
        self.log: list[Decision] = []
        self.take_backs: list[TakeBack] = []
        self.split_yield = getattr(policy, "split_yield", False)

    def schedule(self, view: NodeView) -> NodePlan:
        plan = self.policy.schedule(view)
        late_ids = getattr(self.policy, "late_ids", None)
        d = Decision(view.now, late=late_ids() if late_ids is not None else (),
                     waiting=tuple(r.id for r in view.waiting.iter_by("arrival", WAITING_KEPT)),
                     paused=tuple(s.id for s in view.paused))
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
        granted = self.policy.take_back(view)
        self.take_backs.append(TakeBack(view.now, tuple((x.device, x.request.id)
                                                        for x in view.spares), tuple(granted)))
        return granted

    def rows(self) -> dict[str, list[dict]]:
        """The log as JSON-ready rows: ``decisions`` (one per :class:`Decision`; jobs as
        ``[id, devices, last, large]``, ``placed`` sorted) and ``take_backs``."""
        return {"decisions": [{"now": d.now, "jobs": [[i, list(ds), last, large]
                                        for i, ds, last, large in d.jobs],
                               "placed": sorted(d.placed), "late": list(d.late),
                               "waiting": list(d.waiting), "paused": list(d.paused)}
                              for d in self.log],
                "take_backs": [{"now": t.now, "offered": [list(o) for o in t.offered],
                                "granted": list(t.granted)} for t in self.take_backs]}

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


@dataclass(slots=True)
class Segment:
    """Consecutive decisions in which a request was in one ``state`` (``_state``'s, with
    ``late`` added to a wait the policy counted late): from ``start`` to ``end`` (s: the
    first decision of the next segment, or the request's finish), over ``decisions``
    decisions; ``others`` counts, per id, the decisions in which another request held
    devices (running or placed)."""

    state: str
    start: float
    end: float
    decisions: int
    others: Counter


def from_rows(rows: list[dict]) -> list[Decision]:
    """``DecisionLog.rows()["decisions"]`` (e.g. read back from JSON) as decisions."""
    return [Decision(r["now"], [(i, tuple(ds), last, large) for i, ds, last, large in r["jobs"]],
                     set(r["placed"]), tuple(r["late"]), tuple(r["waiting"]), tuple(r["paused"]))
            for r in rows]


def timeline(log: list[Decision], rid: str, arrival: float, finished: float) -> list[Segment]:
    """What ``rid`` did from ``arrival`` to ``finished`` (s): each decision holds from its
    ``now`` to the next one's (as :func:`time_split`), so a wait that began before any
    decision about ``rid`` shows with the devices held then. Consecutive decisions in one
    state are one segment."""
    segments: list[Segment] = []
    for k, d in enumerate(log):
        end = log[k + 1].now if k + 1 < len(log) else finished
        lo, hi = max(d.now, arrival), min(end, finished)
        if hi <= lo:
            continue
        state = _state(d, rid)
        if state.startswith("wait") and rid in d.late:
            state = "late " + state
        if segments and segments[-1].state == state:
            seg = segments[-1]
            seg.end = hi
        else:
            seg = Segment(state, lo, hi, 0, Counter())
            segments.append(seg)
        seg.decisions += 1
        seg.others.update(j[0] for j in d.jobs if j[0] != rid)
    return segments


def describe(segments: list[Segment], top: int = 3) -> str:
    """One line per segment: ``start–end state (n decisions)``, with the ids that held
    devices most while the request waited."""
    lines = []
    for s in segments:
        line = f"{s.start:8.2f}–{s.end:8.2f} {s.state:<34} ({s.decisions})"
        if "wait" in s.state and s.others:
            line += " held: " + ", ".join(f"{i}×{n}" for i, n in s.others.most_common(top))
        lines.append(line)
    return "\n".join(lines)
