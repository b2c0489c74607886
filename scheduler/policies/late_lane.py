"""The tail guarantee of ``slo``: the *late lane*.

A request that ``slo`` gives up (or that can no longer meet its deadline) joins the lane, for
good (its "late" label never flips back), and gets a **second deadline** it is promised:

    D2 = max(D + windows · (D − A),  now + (W_lane + rem) / share)

— ``windows`` SLO windows past its deadline D (A: arrival), or, when the lane is already
long, the time ``share`` of the device would take to finish the lane up to it (``W_lane``:
the lane's remaining work, ``rem``: its own). (``share`` = 1 promises the tightest bound,
but a lane that is always at zero slack then runs alone and on-time work collapses into it:
measured in docs/results/scheduler.md.) The lane is served **as late as possible**: on-time work
runs first while every lane member can still finish by its D2 with the lane run back to
back in lane order; once the least such *lane slack* is below the next iteration's predicted
length, the iteration runs the lane's head instead, making room for it whatever the memory
pressure (paused requests are offloaded; only a full host as well, or the engine's
``max_active`` for a head not yet started, stops it — then the next member that fits
runs). The give-up rule counts the lane's as-late-as-possible schedule as device time
already taken.

**The bound.** With exact timings, no transfers for the lane head and the head always able
to run, every late request finishes by its D2. Proof: let
``s_k = D2_k − now − Σ_{j ≤ k} rem_j`` over the lane in order.
(i) A newcomer is appended last with ``D2 ≥ now + W_lane + rem``, so its ``s ≥ 0``, and no
earlier ``s`` changes. (ii) Running anything else for T seconds lowers every ``s`` by T, and
is done only when ``min s ≥ T``. (iii) Running the head for T seconds advances ``now`` and lowers
every prefix's remaining work by T each: no ``s`` changes. So ``s_k ≥ 0`` at every decision and a
lane member unfinished after its D2 (``s_k < −rem_k < 0``) cannot exist. Arrivals do not enter
the lane's sums, so no stream of urgent work can push a late request past its D2.
``tests/scheduler/test_sched_tail_bound.py`` checks it on an adversarial trace.
"""

from __future__ import annotations

from ..cost import CostModel
from ..plan import SchedulerView, StepPlan
from ..request import RequestStatus
from .priority_rules import Candidate

INF = float("inf")


class LateLane:
    """The late requests in the order they were given up, each with its second deadline."""

    def __init__(self, windows: float, share: float = 1.0):
        if not windows >= 0:
            raise ValueError(f"late_windows must be >= 0, got {windows!r}")
        if not 0 < share <= 1:
            raise ValueError(f"late_share must be in (0, 1], got {share!r}")
        self.windows = windows
        self.share = share
        self._due: dict[str, float] = {}  # insertion order is lane order
        self._sched: list[tuple[float, float]] = []  # as-late-as-possible (start, rem) by member
        self._members: list[Candidate] = []

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._due

    def __len__(self) -> int:
        return len(self._due)

    def due(self, request_id: str) -> float:
        """The second deadline of a lane member (engine clock, s)."""
        return self._due[request_id]

    def add(self, c: Candidate, now: float, lane_work: float) -> float:
        """Append a given-up candidate (``lane_work``: the lane's remaining work, s); returns
        its second deadline."""
        if c.req.id not in self._due:
            window = c.req.deadline - c.req.arrival
            self._due[c.req.id] = max(
                c.req.deadline + self.windows * window, now + (lane_work + c.rem) / self.share
            )
        return self._due[c.req.id]

    def forget(self, request_id: str) -> None:
        """Drop a finished (or cancelled) request."""
        if self._due.pop(request_id, None) is not None:
            self._members = [c for c in self._members if c.req.id != request_id]

    def prune(self, alive: set[str]) -> None:
        """Forget members that are no longer anywhere in the engine."""
        for rid in [r for r in self._due if r not in alive]:
            del self._due[rid]

    def settle(self, now: float, cands: dict[str, Candidate]) -> list[Candidate]:
        """The decision's lane members (candidates, in lane order) and their as-late-as-
        possible schedule; returns the members."""
        self._members = [cands[rid] for rid in self._due if rid in cands]
        sched = []
        t = INF
        for c in reversed(self._members):
            finish = min(self._due[c.req.id], t)
            t = finish - c.rem
            sched.append((t, c.rem))
        self._sched = sched
        return self._members

    def work(self) -> float:
        """Remaining work of the decision's lane members (s)."""
        return sum(c.rem for c in self._members)

    def forced(self, now: float, delta: float) -> float:
        """Lane work its as-late-as-possible schedule must do within ``delta`` seconds (s)."""
        horizon = now + delta
        return sum(min(rem, max(0.0, horizon - start)) for start, rem in self._sched)

    def slack(self, now: float) -> float:
        """Least lane slack ``D2_k − now − Σ_{j ≤ k} rem_j`` (s; inf with an empty lane)."""
        work, least = 0.0, INF
        for c in self._members:
            work += c.rem
            least = min(least, self._due[c.req.id] - now - work)
        return least

    def head(self) -> Candidate | None:
        """The first member in lane order (None: empty)."""
        return self._members[0] if self._members else None

    def ids(self) -> tuple[str, ...]:
        """Every member's id, in lane order."""
        return tuple(self._due)

    def members(self) -> list[Candidate]:
        """The decision's lane members, in lane order."""
        return self._members


def member_work(c: Candidate, plan: StepPlan) -> float:
    """Predicted work ``plan`` removes from candidate ``c`` (a batch member): its step, and
    its encode if the plan admits it, its decode if this is its last step (s)."""
    done = c.item.steps_done if isinstance(c.item, RequestStatus) else 0
    work = c.tau + (c.enc if c.req.id in plan.admit else 0.0)
    return work + (c.dec if done + 1 >= c.req.steps else 0.0)


def plan_seconds(cost: CostModel, view: SchedulerView, cands: dict[str, Candidate],
                 plan: StepPlan) -> float:
    """Predicted length of one iteration of ``plan`` (transfers, encodes, step, decodes; s)."""
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
        seconds += cost.step_time(model, tokens)
    return seconds
