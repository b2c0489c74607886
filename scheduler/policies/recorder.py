"""A one-device policy wrapper that logs its decisions, to set a real run beside its replay.

``ObservingPolicy(policy, on_report)`` is ``policy`` with every loop report also handed to
``on_report`` (the demo's profile check uses it). ``DecisionLog(policy)``, one such wrapper,
decides exactly as ``policy`` (every other attribute and call, the loop's reports
included, is the wrapped policy's) and keeps, per decision, the plan's
batch, admits, offloads and restores, the ids the policy holds as late (its
``late_ids()``, when it has one: slo's given-up requests), how many requests were started
and waiting, the ids whose tiled decodes were pending (``SchedulerView.decodes``), and —
from the loop's report on that plan — the ids that did step and the step's seconds
(``ran`` None: no report came, e.g. a decode tile ran instead of the plan).
:func:`timeline` then says what one request was doing from decision to decision —
running, planned but not run, waiting, waiting as late, or decoding (its steps done, its
tiles pending) — and what ran while it waited, the same way for the engine's log and the
simulator's, so the first place they part is readable
(``benchmarks/scheduler/demo_misses.py``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass


@dataclass(slots=True)
class Decision:
    """One decision: ``now`` (s, the loop's clock), the plan's ids, the late ids, the
    numbers of started (``active``) and ``waiting`` requests it saw, what the loop
    reported on the plan: ``ran`` (ids stepped; None: no report) and ``step_s`` (s; summed
    over the chunks a block-preempted step continued without deciding again), the ids
    of the pending tiled decodes it saw (``decoding``) and those whose decodes the plan
    sends first after their last step (``first``: ``StepPlan.first_decodes``; ``whole``
    in logs written before session 20, when they ran whole), and the requests the policy
    set aside in it (``gave_up``: ``(id, predicted remaining s, s left to its deadline,
    too late even alone)`` each, from slo's ``gave_up``; empty for other policies)."""

    now: float
    batch: tuple[str, ...]
    admit: tuple[str, ...]
    offload: tuple[str, ...]
    restore: tuple[str, ...]
    late: tuple[str, ...]
    active: int
    waiting: int
    ran: tuple[str, ...] | None = None
    step_s: float | None = None
    decoding: tuple[str, ...] = ()
    first: tuple[str, ...] = ()
    gave_up: tuple[tuple, ...] = ()

    def as_row(self) -> dict:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict) -> Decision:
        ran = row.get("ran")
        return cls(row["now"], *(tuple(row[k]) for k in ("batch", "admit", "offload",
                                                         "restore", "late")),
                   row["active"], row["waiting"], None if ran is None else tuple(ran),
                   row.get("step_s"), tuple(row.get("decoding", ())),
                   tuple(row.get("first", row.get("whole", ()))),
                   tuple(tuple(g) for g in row.get("gave_up", ())))


class ObservingPolicy:
    """A policy that hands every ``StepReport`` to ``on_report`` before the policy's own
    ``observe`` (if any); everything else is the wrapped policy's."""

    def __init__(self, policy, on_report) -> None:
        self._policy = policy
        self._on_report = on_report

    def observe(self, report) -> None:
        self._on_report(report)
        inner = getattr(self._policy, "observe", None)
        if inner is not None:
            inner(report)

    def __getattr__(self, name):
        if name == "_policy":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self._policy, name)


class DecisionLog(ObservingPolicy):
    """``policy`` with its decisions appended to ``self.log`` (module docstring)."""

    def __init__(self, policy) -> None:
        super().__init__(policy, self._note_report)
        self.log: list[Decision] = []

    def schedule(self, now: float, view):
        plan = self._policy.schedule(now, view)
        late_ids = getattr(self._policy, "late_ids", None)
        self.log.append(Decision(now, tuple(plan.batch), tuple(plan.admit),
                                 tuple(plan.offload), tuple(plan.restore),
                                 late_ids() if late_ids is not None else (),
                                 len(view.active), len(view.waiting),
                                 decoding=tuple(d.request.id for d in view.decodes),
                                 first=tuple(plan.first_decodes),
                                 gave_up=tuple((g.id, g.rem, g.left, g.alone) for g in
                                               getattr(self._policy, "gave_up", ()))))
        return plan

    def _note_report(self, report) -> None:
        """What the loop reported on the last decision's plan."""
        if not self.log:
            return
        d = self.log[-1]
        if d.ran is None:
            d.ran, d.step_s = tuple(report.batch), report.step_s
        else:  # a chunked step continued without a new decision (the simulator's block
            # preemption between arrivals): its chunks are this decision's
            d.ran += tuple(i for i in report.batch if i not in d.ran)
            d.step_s += report.step_s


@dataclass(slots=True)
class Segment:
    """Consecutive decisions in which a request was in one ``state`` (``"runs"``,
    ``"planned"`` — in the plan's batch, but the plan did not run or the request did not
    step —, ``"waits"``, ``"waits late"`` or ``"decodes"`` — its steps done, its tiled
    decode pending —): from ``start`` to ``end`` (s, the first decision of
    the next segment, or the last decision seen), over ``decisions`` decisions; ``others``
    counts the ids that ran in them (by id), ``offloaded`` whether it was offloaded then."""

    state: str
    start: float
    end: float
    decisions: int
    others: Counter
    offloaded: bool = False


def timeline(log: list[Decision], rid: str, arrival: float, finished: float) -> list[Segment]:
    """What ``rid`` did from ``arrival`` until ``finished`` (s), segment by segment: the
    decisions at ``arrival <= now < finished`` (one at ``finished`` comes after it finished:
    the simulator decides again at the very time a step ends); ``others``: the ids that
    did step meanwhile."""
    segments: list[Segment] = []
    for d in log:
        if d.now < arrival or d.now >= finished:
            continue
        if rid in d.decoding:
            state = "decodes"
        elif rid in d.batch:
            state = "runs" if d.ran is not None and rid in d.ran else "planned"
        else:
            state = "waits late" if rid in d.late else "waits"
        if segments and segments[-1].state == state:
            seg = segments[-1]
        else:
            if segments:
                segments[-1].end = d.now
            seg = Segment(state, d.now, d.now, 0, Counter())
            segments.append(seg)
        seg.decisions += 1
        seg.end = d.now
        seg.others.update(i for i in (d.ran or ()) if i != rid)
        seg.offloaded |= rid in d.offload
    return segments


def describe(segments: list[Segment], top: int = 3) -> str:
    """One line per segment: ``start–end state (n decisions)``, with the ids that ran most
    while the request waited."""
    lines = []
    for s in segments:
        line = f"{s.start:8.2f}–{s.end:8.2f} {s.state:<10} ({s.decisions})"
        if s.state != "runs" and s.others:
            line += " ran: " + ", ".join(f"{i}×{n}" for i, n in s.others.most_common(top))
        if s.offloaded:
            line += " [offloaded]"
        lines.append(line)
    return "\n".join(lines)
