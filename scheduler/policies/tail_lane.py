"""The tail guarantee of ``slo``: promised second deadlines, kept by an as-late-as-possible
lane.

Two rules say who is promised what (``TailLane(rule)``, ``slo``'s ``tail`` option):

* ``"fifo"`` — *no worse than FIFO's tail.* Every arrival, in arrival order, enters a
  :class:`~ditmem.scheduler.fifo_shadow.FifoShadow` (run-to-completion FIFO on one device,
  standalone times from the cost model), which gives it its FIFO finish ``f_i``, and is
  promised ``d2_i = max(f_i, A_i + c · F_i)``: ``F_i`` a nondecreasing flow budget
  (``FlowBound``: the running ``quantile`` of the shadow's flow times so far, own included;
  quantile 1: the running maximum; never below ``prior``), ``c`` = ``factor`` >= 1. Both
  terms are nondecreasing in arrival order, so arrival order is promise order.
* ``"late"`` — *a bounded wait for what was given up.* A request enters when ``slo`` gives
  it up, promised ``d2 = max(D + windows · (D − A), now + (W + rem) / share)`` (``W``: the
  lane's remaining work, ``rem``: its own; ``share`` = 1 is the tightest promise, but a lane
  that is always at zero slack then runs alone and on-time work collapses into it).

The members, in the order they entered, form the lane; with ``rem_j`` their remaining
standalone work, the lane slack of member k is ``s_k = d2_k − now − Σ_{j <= k} rem_j``. An
iteration that runs ``T`` seconds and removes ``w_j`` of work from its members lowers
``s_k`` by ``T − Σ_{j <= k, j in it} w_j`` (``allows``). ``slo`` runs its own (EDF) plan
while that leaves every ``s_k >= 0``; otherwise the first of its preferred heads (with
joiners, if they keep it) whose run does, and failing all those the lane's head, with room
made for it whatever the memory pressure.

**The bound.** With exact timings, no transfers, packed steps costing no more than their
members alone (so ``T <= Σ w_j``; the head alone: ``T = w_head``) and the head always able
to run, every member finishes by its ``d2``. Proof: (i) a newcomer is appended last, so no
earlier ``s_k`` changes, and its own ``s >= 0``: under ``"late"`` by the second term of its
``d2``; under ``"fifo"`` by conservation — both this schedule and the shadow take the
standalone work ``p_i`` of each arrival, the shadow removes it at rate 1 while busy and this
schedule at rate >= 1 while busy (packed steps cost at most their members alone), and this
schedule is busy whenever it has work, so its remaining work never exceeds the shadow's:
at i's arrival ``now + Σ_{j < i} rem_j + p_i <= now + backlog + p_i = f_i <= d2_i``.
(ii) An iteration is chosen only if it leaves every ``s_k >= 0``; the head alone always
does (``w_head = T`` lowers no ``s_k``). (iii) So ``s_k >= 0`` at every decision, and a
member unfinished past its ``d2`` (``s_k < −rem_k < 0``) cannot exist; arrivals never
enter an earlier member's sums, so no stream of urgent work can push one past its promise.
Under ``"fifo"`` each flow is then at most ``max(f_i − A_i, c · F_i)``: with quantile 1,
``c`` = 1 and no prior, no flow exceeds FIFO's largest — which no schedule without packing
gains can beat (``tail_bound``) — and with q < 1 a flow above ``c · F_i`` needs its own FIFO
flow above it, so the q-quantile of flows is about FIFO's or less.
Where decodes run tile by tile between steps (``decode="tiled"``, the server's default for
``slo``), a member's decode would otherwise wait for the decode lane's late share after
its last step — outside the lane's sums, so the promise could pass (session 18: on 10 of 10
random traces under ``"fifo"``, up to 1.10 × fifo's maximum); ``slo`` therefore lists
members taking their last step in ``StepPlan.first_decodes``: their tiles go first, a member
stays in the lane with the seconds of its tiles left (``settle``'s ``decoding``) until its
decode is delivered, and ``slo`` lets a plan or another decode's tile go ahead of them only
where every lane slack stays >= 0 (so (ii) holds for tiles too).
Timing noise, transfers and a head blocked by memory break the premises; the policy then
still runs the head first, and the measured excess is in docs/results/scheduler.md.
``tests/scheduler/test_sched_tail_bound.py`` checks both rules on adversarial and random
traces, ``"fifo"`` against the simulator's own ``fifo`` run (exact timings).
"""

from __future__ import annotations

import math

from ..cost import CostModel
from ..fifo_shadow import FifoShadow, FlowBound
from ..plan import SchedulerView, StepPlan
from ..request import Request, RequestStatus
from .priority_rules import Candidate

INF = float("inf")


TAIL_RULES = ("fifo", "late")


class TailLane:
    """The promised requests in lane order, each with its second deadline ``d2`` (s), by
    ``rule`` (module docstring): ``"fifo"`` with ``quantile``, ``factor`` and ``prior``
    (s); ``"late"`` with ``windows`` and ``share``."""

    def __init__(self, rule: str = "fifo", *, quantile: float = 1.0, factor: float = 1.0,
                 prior: float = 0.0,
                 windows: float = 3.0, share: float = 0.1):
        if rule not in TAIL_RULES:
            raise ValueError(f"tail must be one of {TAIL_RULES}, got {rule!r}")
        if not windows >= 0:
            raise ValueError(f"late_windows must be >= 0, got {windows!r}")
        if not 0 < share <= 1:
            raise ValueError(f"late_share must be in (0, 1], got {share!r}")
        self.rule = rule
        self.windows = windows
        self.share = share
        self.shadow = FifoShadow(1)
        if not prior >= 0:
            raise ValueError(f"tail_prior must be >= 0 s, got {prior!r}")
        self.budget = FlowBound(quantile, start=prior)
        if not factor >= 1:
            raise ValueError(f"tail_factor must be >= 1, got {factor!r}")
        self.factor = factor
        self._due: dict[str, float] = {}  # insertion (= arrival) order is lane order
        self._work: dict[str, float] = {}  # standalone work at arrival (s)
        self._ids: list[str] = []
        self._rem: list[float] = []
        self._slack: list[float] = []
        self._least = INF
        self._pos: dict[str, int] = {}
        self._alap: list[tuple[float, float, str]] = []  # (latest start, rem, id) by lane

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._due

    def __len__(self) -> int:
        return len(self._due)

    def due(self, request_id: str) -> float:
        """The promise ``d2`` of a lane member (engine clock, s)."""
        return self._due[request_id]

    def ids(self) -> tuple[str, ...]:
        """Every member's id, in lane (arrival) order."""
        return tuple(self._due)

    def see(self, view: SchedulerView, cost: CostModel) -> None:
        """``rule="fifo"``: promise every request that arrived since the last call."""
        if self.rule != "fifo":
            return
        latest = self.shadow.latest
        since = math.nextafter(latest, -INF) if latest > -INF else -INF
        for r in view.waiting.arrived_after(since):
            if r.id in self._due:  # seen already (same arrival time as the latest)
                continue
            self._add(r, cost.standalone_time(r))

    def _add(self, r: Request, work: float) -> None:
        entry = self.shadow.add(r.id, r.arrival, work)
        self.shadow.forget(r.id)  # only its timeline is needed
        flow = self.budget.see(entry.flow)
        self._due[r.id] = max(entry.finish, r.arrival + self.factor * flow)
        self._work[r.id] = work

    def add_late(self, c: Candidate, now: float) -> None:
        """``rule="late"``: append a request just given up (after ``settle``; others may
        have been appended since)."""
        if self.rule != "late" or c.req.id in self._due:
            return
        window = c.req.deadline - c.req.arrival
        lane_work = sum(self._rem) + sum(self._work[r] for r in self._due if r not in self._pos)
        self._due[c.req.id] = max(c.req.deadline + self.windows * window,
                                  now + (lane_work + c.rem) / self.share)
        self._work[c.req.id] = c.rem

    def forget(self, request_id: str) -> None:
        """Drop a finished (or cancelled) request."""
        if self._due.pop(request_id, None) is not None:
            del self._work[request_id]

    def settle(self, now: float, view: SchedulerView, cands: dict[str, Candidate],
               decoding: dict[str, float] | None = None) -> None:
        """This decision's lane: drop members no longer in the engine; remaining work from
        ``cands`` where given, else the seconds left of their tiled decode (``decoding``, by
        id: steps done, decode pending), else the work at arrival (not started); the
        slacks."""
        active = {s.id for s in view.active}
        decoding = decoding or {}
        ids, rems, slack = [], [], []
        work, least = 0.0, INF
        for rid, due in list(self._due.items()):
            c = cands.get(rid)
            if c is not None:
                rem = c.rem
            elif rid in decoding:
                rem = decoding[rid]
            elif rid in active or rid in view.waiting:
                rem = self._work[rid]
            else:  # cancelled, or finished (decode included)
                self.forget(rid)
                continue
            ids.append(rid)
            rems.append(rem)
            work += rem
            s = due - now - work
            slack.append(s)
            least = min(least, s)
        self._ids, self._rem, self._slack, self._least = ids, rems, slack, least
        self._pos = {rid: n for n, rid in enumerate(ids)}
        alap, t = [], INF
        for n in range(len(ids) - 1, -1, -1):
            t = min(self._due[ids[n]], t) - rems[n]
            alap.append((t, rems[n], ids[n]))
        alap.reverse()
        self._alap = alap

    def positions(self) -> dict[str, int]:
        """Each member's place in this decision's lane (0: the head)."""
        return self._pos

    def head(self) -> str | None:
        """The oldest unfinished request's id (None: empty)."""
        return self._ids[0] if self._ids else None

    def slack(self) -> float:
        """Least lane slack of this decision (s; inf with an empty lane)."""
        return self._least

    def allows(self, seconds: float, work: dict[str, float]) -> bool:
        """Does an iteration of ``seconds`` that removes ``work[id]`` from its members leave
        every lane slack >= 0?"""
        if self._least >= seconds - 1e-9:
            return True
        marks = sorted((self._pos[rid], w) for rid, w in work.items() if rid in self._pos)
        credit, m = 0.0, 0
        for k, s in enumerate(self._slack):
            while m < len(marks) and marks[m][0] <= k:
                credit += marks[m][1]
                m += 1
            if s - seconds + credit < -1e-9:
                return False
        return True

    def forced(self, now: float, delta: float, skip: set[str]) -> float:
        """Work of members not in ``skip`` that the lane's as-late-as-possible schedule
        (of this decision) must do within ``delta`` seconds (s)."""
        horizon = now + delta
        total = 0.0
        for start, rem, rid in self._alap:  # latest starts rise along the lane
            if start >= horizon:
                break
            if rid not in skip:
                total += min(rem, horizon - start)
        return total


def is_last_step(c: Candidate) -> bool:
    """Is the next step of candidate ``c`` its last?"""
    done = c.item.steps_done if isinstance(c.item, RequestStatus) else 0
    return done + 1 >= c.req.steps


def member_work(c: Candidate, plan: StepPlan) -> float:
    """Predicted work ``plan`` removes from candidate ``c`` (a batch member): its step, and
    its encode if the plan admits it, its decode if this is its last step (s) — counted
    with the iteration, as ``plan_seconds`` counts it: where decodes run tile by tile the
    member's tiles go first after the step (``StepPlan.first_decodes``) and stay in the
    lane's sums until delivered, so both sides of the sum see them."""
    work = c.tau + (c.enc if c.req.id in plan.admit else 0.0)
    return work + (c.dec if is_last_step(c) else 0.0)


def plan_seconds(cost: CostModel, view: SchedulerView, cands: dict[str, Candidate],
                 plan: StepPlan) -> float:
    """Predicted length of one iteration of ``plan`` (transfers, encodes, step, decodes; s).
    The packed step is never predicted shorter than any of its members' own steps (its
    online correction is its shape class's, learned on other mixes of that total)."""
    pages = {s.id: s.pages for s in view.active}
    moved = sum(pages.get(rid, 0) for rid in (*plan.offload, *plan.restore))
    seconds = cost.transfer_time(moved * view.memory.page_bytes) if moved else 0.0
    tokens, model = [], None
    for rid in plan.batch:
        c = cands.get(rid)
        if c is None:
            r = view.waiting.get(rid)
            tokens.append(cost.tokens(r))
            model = r.model
            seconds += cost.encode_time(r) if rid in plan.admit else 0.0
            continue
        tokens.append(c.tokens)
        model = c.req.model
        done = c.item.steps_done if isinstance(c.item, RequestStatus) else 0
        seconds += c.enc if rid in plan.admit else 0.0
        seconds += c.dec if done + 1 >= c.req.steps else 0.0
    if tokens:
        seconds += max(cost.step_time(model, tokens),
                       *(cost.step_time(model, [t]) for t in tokens))
    return seconds
