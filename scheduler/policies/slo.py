"""``slo``: the policy we ship — deadline/slack- and priority-aware, batching- and memory-aware.

Each iteration, over the started requests and the first few waiting ones (by deadline and
by this policy's own order — never a scan of the whole queue):

1. **Feasibility.** On-time requests sorted by deadline, with their predicted remaining
   work summed in that order, give each one a *slack*: how long the device could do
   something else and still finish everything up to it in time (with a ``headroom``
   fraction of the time reserved for requests that have not arrived yet). A request that
   cannot make its deadline even alone, or whose deadline prefix cannot be met (then the
   one with the most remaining work per priority weight is given up, as in Moore–Hodgson),
   becomes *late*: it still runs to completion, in the device's spare time.
2. **Choice.** Among on-time requests, the one with the smallest *urgency key*
   ``arrival + beta · remaining / weight`` runs, provided every request with an earlier
   deadline keeps enough slack to absorb the step; otherwise the earliest deadline runs.
   Small beta favours old (large) requests that the deadline test lets go first, using
   the small requests' slack; the weights 3:2:1 favour higher priorities.
3. **Batching.** Compatible requests (same model) join the step while the cost model says
   it pays (the batch's step time grows by less than ``1 - min_gain`` of the joiner's own
   step) and the longer step still fits every other request's slack.
4. **Memory.** A waiting request is admitted only if its pages fit; otherwise paused
   requests with the latest deadlines are offloaded to the host (their transfer time is
   part of the iteration), and restored when chosen again.
5. **No starvation.** A late request that has waited ``aging`` × its own SLO window past its
   deadline runs before anything else; late requests otherwise run when nothing on time
   is runnable, shortest remaining first.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..plan import SchedulerView, StepPlan
from ..request import Request, RequestStatus
from .base import Policy, make_room


@dataclass(slots=True)
class _Cand:
    item: RequestStatus | Request
    req: Request
    rem: float
    tau: float
    tokens: int
    slack: float = 0.0
    guard: float = 0.0
    late: bool = False


class SloPolicy(Policy):
    """See the module docstring. Parameters are fractions and seconds-free factors."""

    name = "slo"

    def __init__(
        self,
        cost,
        *,
        beta: float | None = 1.0,
        headroom: float = 0.25,
        min_gain: float = 0.1,
        aging: float = 10.0,
        window: int = 32,
        batching: bool = True,
        give_up_headroom: float = 0.0,
        sticky: bool = False,
    ):
        super().__init__(cost)
        self.beta = beta
        self.headroom = headroom
        self.min_gain = min_gain
        self.aging = aging
        self.window = window
        self.batching = batching
        self.give_up_headroom = give_up_headroom
        self.sticky = sticky
        self._given_up: set[str] = set()
        self._order = f"slo-key:{beta}"

    def _key(self, req: Request, rem: float) -> float:
        if self.beta is None:
            return req.deadline
        return req.arrival + self.beta * rem * 2.0 / req.weight

    def _candidates(self, view: SchedulerView) -> list[_Cand]:
        cost = self.cost
        out: list[_Cand] = []
        for s in view.active:
            r = s.request
            tokens = cost.tokens(r)
            tau = cost.step_time(r.model, [tokens])
            out.append(_Cand(s, r, cost.remaining_time(r, s.steps_done), tau, tokens))
        waiting = view.waiting
        waiting.ensure_order(self._order, lambda r: self._key(r, r.standalone_s))
        seen: set[str] = set()
        for order in ("deadline", self._order):
            for r in waiting.iter_by(order, self.window):
                if r.id in seen:
                    continue
                seen.add(r.id)
                tokens = cost.tokens(r)
                tau = cost.step_time(r.model, [tokens])
                out.append(_Cand(r, r, cost.remaining_time(r, 0), tau, tokens))
        return out

    def _classify(self, now: float, cands: list[_Cand]) -> list[_Cand]:
        """Mark late requests; return the on-time ones by deadline with slack and guard set."""
        ontime = []
        for c in cands:
            c.late = now + c.rem > c.req.deadline or c.req.id in self._given_up
            if not c.late:
                ontime.append(c)
        ontime.sort(key=lambda c: (c.req.deadline, c.req.arrival))
        # Moore–Hodgson: drop the largest remaining work per weight from an infeasible prefix.
        kept, heap, work = [], [], 0.0
        for c in ontime:
            work += c.rem
            heapq.heappush(heap, (-c.rem / c.req.weight, id(c), c))
            kept.append(c)
            while work > (c.req.deadline - now) * (1.0 - self.give_up_headroom) and heap:
                _, _, victim = heapq.heappop(heap)
                victim.late = True
                work -= victim.rem
                if self.sticky:
                    self._given_up.add(victim.req.id)
        ontime = [c for c in kept if not c.late]
        work, guard = 0.0, float("inf")
        for c in ontime:
            c.guard = guard
            work += c.rem
            c.slack = (c.req.deadline - now) * (1.0 - self.headroom) - work
            guard = min(guard, c.slack)
        return ontime

    def schedule(self, now: float, view: SchedulerView) -> StepPlan:
        cands = self._candidates(view)
        if not cands:
            return self.with_pause(StepPlan(), view)
        ontime = self._classify(now, cands)
        late = [c for c in cands if c.late]
        head = self._starving(now, late, ontime)
        if head is None and ontime:
            if self.beta is None:
                head = ontime[0]
            else:
                best = min(ontime, key=lambda c: self._key(c.req, c.rem))
                head = best if best.guard >= best.tau else ontime[0]
        if head is None:
            head = min(late, key=lambda c: (c.rem / c.req.weight, c.req.arrival))
        plan = StepPlan()
        if not make_room(self.cost, view, [head.item], plan):
            return self.with_pause(plan, view)
        if self.batching:
            self._fill_batch(view, plan, head, ontime, late)
        return self.with_pause(plan, view)

    def _starving(self, now: float, late: list[_Cand], ontime: list[_Cand]) -> _Cand | None:
        """The oldest late request waiting past ``aging`` SLO windows, if on-time requests
        can absorb its step (always, past twice that)."""
        old = [
            c for c in late if now - c.req.deadline > self.aging * (c.req.deadline - c.req.arrival)
        ]
        if not old:
            return None
        c = min(old, key=lambda c: c.req.deadline)
        hard = now - c.req.deadline > 2 * self.aging * (c.req.deadline - c.req.arrival)
        if hard or all(o.slack >= c.tau for o in ontime):
            return c
        return None

    def _fill_batch(self, view, plan, head, ontime, late) -> None:
        cost = self.cost
        model = head.req.model
        limit = cost.max_batch(model)
        batch = [head]
        step = head.tau
        others = sorted(
            (c for c in ontime + late if c.req.model == model and c is not head),
            key=lambda c: (c.late, self._key(c.req, c.rem)),
        )
        for c in others:
            if len(batch) >= limit:
                break
            new_step = cost.step_time(model, [m.tokens for m in batch] + [c.tokens])
            if new_step - step > (1.0 - self.min_gain) * c.tau:
                continue
            trial = batch + [c]
            if not self._batch_fits(trial, new_step, ontime):
                continue
            if make_room(cost, view, [c.item], plan):
                batch = trial
                step = new_step

    @staticmethod
    def _batch_fits(batch: list[_Cand], step: float, ontime: list[_Cand]) -> bool:
        """Every on-time member still meets its slack if all its remaining steps run at the
        batch's step time, and every on-time non-member can absorb one such step."""
        ids = {id(c) for c in batch}
        for c in batch:
            if not c.late:
                steps_left = c.rem / c.tau if c.tau > 0 else 0.0
                if steps_left * (step - c.tau) > c.slack:
                    return False
        return all(c.slack >= step for c in ontime if id(c) not in ids)
