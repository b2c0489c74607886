"""``slo``: the policy we ship — deadline/slack- and priority-aware, batching- and memory-aware.

Each iteration, over the started requests and the first ``window`` waiting ones by deadline
(never a scan of the whole queue):

1. **Give up what cannot make it, early and cheaply.** On-time requests are taken in
   deadline order and their remaining work summed — each step counted at its cost in the
   model's best packing (``packing``: a 512² step on h200 costs 0.094 s alone and 0.073 s
   in a batch of 4), so requests that will share steps are not given up for work the
   batch never does; where the sum exceeds the device time
   left before a deadline — before the deadline of a request of the highest priority class
   among recent arrivals, minus the work that future arrivals are expected to slot in first
   (``forecast``, learned online from recent arrivals), by more than the timing error the
   cost model has measured (``give_up_sds`` × Σ each member's work × its step times'
   relative spread, ``CostModel.step_spread``: a knife-edge overrun is as likely not to
   happen, and the next decision sees it again) — the request with the most
   remaining work per priority weight is set aside as *late* (Moore–Hodgson's rule,
   weighted 3:2:1) — except that a priority-0 pick is swapped, one miss for one miss, for a
   lower-priority request whose remaining work alone covers the overrun, or else for an
   equal priority-0 request due later (``shield0``). Then (``take_back``, on) the requests set
   aside in this decision are taken back, least remaining work per weight first, each one whose
   return leaves every on-time deadline prefix within its capacity: a later give-up can make an
   earlier one needless (two large requests overrunning together lose the smaller-weighted one
   first, then the other as well), as the clairvoyant reference's own take-back pass finds (issue
   13: the demo traces at run speed). With ``forecast_shield0`` (an option, off), when no present
   lower-priority request covers the overrun but the forecast lower-priority arrivals due before
   the priority-0 pick do, nobody is set aside: those arrivals are work the same swap gives up
   for it once they are present, so they take nothing from it. So is a request that cannot finish
   in time even alone. Late requests are never dropped, and stay late: they join the *late lane*
   (6.), and also run whenever nothing on time is runnable (2.).
2. **Run the earliest deadline.** Among on-time requests the earliest deadline runs: large
   requests, whose deadlines are far, are deferred while they still have slack, and small
   ones go first; late ones run in spare time, first those that could still finish in time
   alone, then in lane order. ``rescue0`` (default 0.5) runs an on-time priority-0 request
   whose own slack has fallen below that fraction of its remaining work ahead of earlier-due
   requests — only while each of those keeps slack for ``rescue_guard`` (10) of its steps, so
   they lose nothing. (Orders measured and removed in session 17 — arrival order under an
   EDF guard, an SRPT-like key, priority-0 urgency and protection, late requests oldest or
   least-remaining first: docs/results/scheduler.md, "Session 17".)
3. **Batch when it pays.** Requests of the same model join the step while the profile
   says the step grows by less than ``1 - min_gain`` of the joiner's own step time (in the
   profile's units, ``CostModel.base_step_time``: the online corrections are per shape
   class of a step's total tokens, and on the real demo they made a 1024² joining a 256²
   step look 17 % cheaper than the two apart, where the profile says 0 %: the 256² then ran
   at the 1024²'s step time and missed), and after the longer step (never predicted
   shorter than the step without the joiner, nor than the joiner's own step) every
   on-time request is still as feasible (deadline order, remaining work) as after a
   step of the head alone, each keeping slack of at least ``join_sds`` (2) × the measured
   relative spread of its step times × its remaining work (or what the head alone would
   leave it, if less): a join spends slack at once, the device's timing error shows only
   step by step, so a join that leaves less than that error is a miss the noise decides
   (docs/results/scheduler.md, "Session 24": seed-mix +0.07 point, gamma CV 2 +0.70,
   priority 0 +0.20 / +1.40, fewer misses beyond the clairvoyant's on the demo traces);
   with ``join_margin0`` > 0 (an option, 0 by default) an on-time priority-0 request must
   also keep slack of at least that fraction of its remaining work (or what the head alone
   would leave it, if less), so a joiner does not take a priority-0 request's last seconds
   before the device's timing error shows (docs/results/scheduler.md, Session 8: +0.15 to
   +3.25 points p0 on seed-mix, held-out and gamma, −0.05 on the demo traces). Decided step
   by step: a batch keeps going while the slack allows, then members continue alone.
4. **Memory.** A request starts only if its pages fit; otherwise paused requests are moved
   to the host (late ones first, then latest deadline) — the transfer time is part of the
   iteration — and brought back when they run again.
5. **Inside a step (``--preemption block``).** At a preemption point between blocks the
   running part-done step continues unless finishing it would eat the slack of some on-time
   request served before it (an urgent arrival): only then is it parked. A part-done step
   resumes as the same batch and takes no joiners.
6. **The tail bound (``tail_lane``).** Requests are promised a second deadline and are
   guaranteed to finish by it (exact timings; proofs in ``tail_lane``), by one of two rules
   (``tail``):

   * ``"late"`` (default): a request given up is promised
     ``D2 = max(D + late_windows · (D − A), now + (lane work + its own) / late_share)``;
   * ``"fifo"``: every request is promised ``max(f, A + tail_factor · F)`` — ``f`` its
     finish under FIFO (``fifo_shadow``, fed every arrival), ``F`` the running maximum (or
     ``tail_quantile``) of FIFO's flow times so far, starting from ``tail_prior`` — so no
     flow exceeds ``max(own FIFO flow, tail_factor · FIFO's worst so far)``: with factor 1
     the maximum is at most fifo's (which no schedule without batching can beat).

   With tiled decodes (``decode="tiled"``, the server's default) the promises count each
   member's decode right after its last step, so each plan names the members taking their
   last step in ``StepPlan.first_decodes``: their tiles go before any later step, and the
   member stays in the lane's sums with its tiles left until its decode is delivered. A
   plan goes ahead of those tiles (``StepPlan.hold_tiles``) only where it keeps every
   promise and an on-time request cannot spare the seconds they have left, or their next
   tile would break an earlier member's promise; an on-time decode that would miss behind
   them may run its tiles first within the least lane slack (``StepPlan.yield_s``). (Until
   session 20 those decodes ran whole after the step: a 256² arriving meanwhile waited up
   to a 1024²'s whole decode, 0.4–0.5 misses per demo trace at ×1.00–1.05 speed. Before
   session 18 they waited for the decode lane's credit outside the lane's sums: on the 8
   random traces of ``tests/scheduler/test_sched_tail_bound.py`` with ``late_windows=0.5,
   late_share=1``, 732 promises broken, up to 474 s; now none.) With no member decoding,
   the plan holds back the loop's tiles when the longest pending one run ahead of it
   would break a promise. Other late
   decodes (a request that went late after its steps) are tiles outside the lane, run on
   the loop once a ``late_share`` credit covers each one (``decode_lane``).
   ``late_tile_margin`` (an option, off) also lets them into on-time slack: each plan
   grants the earliest-deadline late decode ``min over on-time requests c of (slack_c −
   late_tile_margin · (D_c − A_c))`` seconds, capped by the least lane slack so no promise
   pays for it (``StepPlan.late_tiles_s``; at least 0; 0 with nothing on time), less the
   tiles of pending decodes that can still make it (taken again with ``see_decodes``, which
   already left them out: conservative), and its next tile runs instead of the step when it
   fits. With ``late_rank="arrival"`` (late requests oldest first in spare time, an option)
   it cut P99 ÷ fifo's on the 12 saved demo traces (3 noise seeds) at 10 % slower true
   times from 2.58 to 1.75 (at the profile's speed 1.73 → 1.63, no point lost) but cost 0.5
   point there (1.3–2.4 on s5_run1, s5_run2, s6_edf_run2: the slack it spends is the
   model's, and the model is 10 % fast), so it is not the default
   (``benchmarks/scheduler/replay_tail.py``, results/replay_tail_s9.json).

   The promised requests are served as late as possible in lane order: an iteration runs
   only if it leaves every member able to finish by its promise with the lane run back to
   back — the EDF plan when it does, else the first preferred head (with joiners, if they
   keep it) that does, else the lane's head, with room made for it whatever the memory
   pressure; the give-up rule counts the lane's schedule as time already taken. So no
   request waits without bound, and a stream of urgent work cannot push one past its
   promise. What each rule costs in attainment: docs/results/scheduler.md (the FIFO rule
   at factor 1 costs ~12 points; the default keeps attainment and bounds every wait).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..plan import SchedulerView, StepPlan, StepReport
from ..request import Request, RequestStatus
from .base import Policy, make_room
from .forecast import ArrivalForecast
from .inside_step import group_of, is_part_done, keep_running, running_step
from .priority_rules import Candidate, late_order, rescued, set_aside
from .tail_lane import TailLane, is_last_step, member_work, plan_seconds

INF = float("inf")

#: Whose deadlines are charged the forecast of future arrivals (``SloPolicy``'s ``forecast``).
FORECAST_MODES = ("top", "all", "off")
#: The order of late requests in spare time (step 2): those that could still finish in time
#: alone first, then as given up (``"lane"``); or simply oldest first (``"arrival"``).
LATE_RANKS = ("lane", "arrival")
#: The give-up rule sets aside the largest ``remaining / weight**GIVE_UP_POWER`` (weights
#: 3:2:1). 1 since session 20 (2 before, i.e. 9:4:1: it set aside a nearly done priority-2
#: request to save a priority-1 one that was then given up too; docs/results/scheduler.md).
GIVE_UP_POWER = 1.0


@dataclass(frozen=True, slots=True)
class GiveUp:
    """One request ``slo`` set aside in a decision, as it saw it then: its predicted
    remaining work ``rem`` and the seconds ``left`` to its deadline (both s); ``alone``:
    it could not finish in time even alone (``rem > left``), else a deadline prefix
    overran and the give-up rule picked it."""

    id: str
    rem: float
    left: float
    alone: bool


def _give_up_key(c: Candidate) -> float:
    """Remaining work per weight**``GIVE_UP_POWER`` (s): the give-up rule's order."""
    return c.rem / c.req.weight**GIVE_UP_POWER


class SloPolicy(Policy):
    """See the module docstring. Options (defaults measured in docs/results/scheduler.md):

    * ``forecast`` — whose deadlines lose the expected work of future earlier-due arrivals
      from the time left before them (steps 1 and 3): ``"top"`` (default) those of the
      highest priority class among the recent arrivals only (``ArrivalForecast.
      top_priority``: priority 0 where it arrives), so lower-priority work is set aside for
      expected arrivals only where it protects the top class — on traffic of one class
      that is every request, as ``"all"``; ``"all"`` every request's (the rule before
      session 19); ``"off"`` none. Measured in docs/results/scheduler.md, "Session 19":
      against ``"all"``, ``"top"`` gains 0.08–0.35 point on the h200 mixes with priorities
      (seed-mix, held-out seeds, gamma CV 2, wan, video-image) for up to 0.25 point of
      priority 0 (video-image: +0.05), and on 270 demo traces run at ×1.00–1.05 of their
      profile's speed it misses 1.29 requests per trace beyond the clairvoyant's instead of
      1.51 (``"off"``: 1.23, but worse at ×1.05, a point of priority 0 lower on h200, and
      on one-class HTTP-bench traffic up to a point of client attainment lower);
    * ``shield0`` — the give-up swap for priority 0 (step 1; on by default);
    * ``take_back`` — after the give-ups of a decision, take back each of them that fits again
      (step 1; on by default);
    * ``give_up_sds`` — how many measured spreads of the prefix's predicted work (each
      member's remaining work × the relative spread of its step times, summed: errors
      taken as correlated) an overrun may reach before anyone is set aside for it (step 1;
      default 2; 0: any overrun; docs/results/scheduler.md, "Session 21": on the demo's
      traces 0.76 → 0.63 misses per trace beyond the clairvoyant's at 3 % step noise,
      0.67 → 0.43 at the 8 % the real machine's small steps show);
    * ``join_sds`` — how many measured spreads of an on-time request's remaining work
      (its remaining work × the relative spread of its step times) a join must leave it as
      slack (step 3; default 2; 0: any slack down to zero, the rule before session 24);
    * ``forecast_shield0`` — no priority-0 give-up for an overrun that forecast
      lower-priority arrivals cover (step 1; off: p0 +0.10 to +0.45, overall −0.06 to −0.25);
    * ``join_margin0`` — the slack (fraction of its remaining work) a joiner must leave an
      on-time priority-0 request (step 3; 0, the default: any slack down to zero);
    * ``lone_p0_unpacked`` — a priority-0 request that no other candidate shares a shape
      with gets no packing credit (``packing``) in the give-up rule and the slacks (off);
    * ``rescue0`` (0 = off) and ``rescue_guard`` — the targeted promotion of an at-risk
      priority-0 request (step 2);
    * ``min_gain`` — least throughput gain (fraction of a joiner's step) for batching;
    * ``see_decodes`` — count the tiled decodes pending on the loop (``SchedulerView.decodes``,
      each one that can still make its deadline, priced by the cost model) as device time
      taken before every deadline after theirs: their tiles run instead of a step due later
      (``decode_lane.TiledDecodes``), so without it the capacities are too large by them;
    * ``packing`` — the fraction of the best packing gain (the model's ``max_batch`` of the
      same shape) the give-up rule and the slacks credit each remaining step with (1: all;
      0: batch-1 times, the previous rule; measured in docs/results/scheduler.md);
    * ``tail`` — the promise rule (step 6): ``"late"`` or ``"fifo"``;
    * ``late_windows`` and ``late_share`` (``tail="late"``) — a late request is promised to
      finish by ``late_windows`` SLO windows past its deadline, or, when the lane is long,
      by the time ``late_share`` of the device would finish the lane up to it;
    * ``tail_factor``, ``tail_quantile``, ``tail_prior`` (``tail="fifo"``) — no flow above
      ``max(own FIFO flow, tail_factor × F)``, ``F`` the running ``tail_quantile`` (1: the
      maximum) of FIFO's flows, never below ``tail_prior`` s (e.g. FIFO's worst on past
      traffic, so a restarted server does not start with tight promises);
    * ``late_tile_margin`` — with tiled decodes, the late decodes' tiles may use the time
      every on-time request can spare beyond that fraction of its SLO window (step 6;
      None, the default: off, late tiles wait for their ``late_share`` credit or an idle
      loop);
    * ``late_rank`` — the order of late requests in spare time (step 2): ``"lane"`` (those
      still able to finish in time alone first, then as given up; default) or ``"arrival"``
      (oldest first: with ``late_tile_margin`` it cut the demo traces' P99 at 10 % slower
      true times, session 9);
    * ``promise_tries`` — how many preferred heads to try when the plan would break a
      promise, before the lane's head runs;
    * ``window`` — how many waiting requests (by deadline) each decision looks at;
    * ``batching`` — off to run one request per step;
    * ``chunk_budget`` — largest fraction of compute the preemption points between blocks
      may cost (block-level preemption; the least chunk, ``chunking.choose_chunk``);
    * ``chunk_wait_share`` — chunks are made as long as ``chunk_wait_share`` × the least
      slack (SLO window − standalone time) of recent arrivals allows, so steps are only
      split as finely as arrivals need (no split at all when they can wait a whole step).
    """

    name = "slo"

    def __init__(
        self,
        cost,
        *,
        forecast: str = "top",
        shield0: bool = True,
        take_back: bool = True,
        forecast_shield0: bool = False,
        rescue0: float = 0.5,
        rescue_guard: float = 10.0,
        min_gain: float = 0.1,
        tail: str = "late",
        tail_quantile: float = 1.0,
        tail_factor: float = 1.0,
        tail_prior: float = 0.0,
        late_windows: float = 3.0,
        late_share: float = 0.1,
        late_tile_margin: float | None = None,
        late_rank: str = "lane",
        window: int = 32,
        promise_tries: int = 8,
        packing: float = 1.0,
        join_margin0: float = 0.0,
        lone_p0_unpacked: bool = False,
        batching: bool = True,
        see_decodes: bool = False,
        chunk_budget: float | None = None,
        chunk_wait_share: float = 0.25,
        give_up_sds: float = 2.0,
        join_sds: float = 2.0,
    ):
        super().__init__(cost)
        self.lane = TailLane(tail, quantile=tail_quantile, factor=tail_factor, prior=tail_prior,
                               windows=late_windows, share=late_share)
        self._late: set[str] = set()
        if late_tile_margin is not None and not late_tile_margin >= 0:
            raise ValueError(f"late_tile_margin must be >= 0 or None, got {late_tile_margin!r}")
        self.late_tile_margin = late_tile_margin
        if late_rank not in LATE_RANKS:
            raise ValueError(f"late_rank must be one of {LATE_RANKS}, got {late_rank!r}")
        self.late_rank = late_rank
        self._skip: set[str] = set()
        if chunk_budget is not None:
            self.chunk_budget = chunk_budget
        self.chunk_wait_share = chunk_wait_share
        if forecast not in FORECAST_MODES:
            raise ValueError(f"forecast must be one of {FORECAST_MODES}, got {forecast!r}")
        self.forecast = ArrivalForecast() if forecast != "off" else None
        self._forecast_all = forecast == "all"
        self.shield0 = shield0
        self.take_back = take_back
        if forecast_shield0 and forecast == "off":
            raise ValueError("forecast_shield0 needs a forecast (it spares the lower-priority "
                             "forecast charged to priority 0)")
        self.forecast_shield0 = forecast_shield0
        self.rescue0 = rescue0
        self.rescue_guard = rescue_guard
        self.min_gain = min_gain
        self.window = window
        self.promise_tries = promise_tries
        if not 0.0 <= packing <= 1.0:
            raise ValueError(f"packing must be in [0, 1], got {packing!r}")
        self.packing = packing
        if not join_margin0 >= 0:
            raise ValueError(f"join_margin0 must be >= 0, got {join_margin0!r}")
        self.join_margin0 = join_margin0
        self.lone_p0_unpacked = lone_p0_unpacked
        self._shapes: dict[tuple[str, int], int] = {}
        self._gain: dict[tuple[str, int], float] = {}
        self.batching = batching
        self.see_decodes = see_decodes
        self._decodes: list[tuple[float, float]] = []  # (deadline, s left), the view's on-time
        self._static: dict[str, tuple[int, int]] = {}
        self._decoding: dict[str, float] = {}  # lane members' tiled decodes: predicted s left
        self.gave_up: tuple[GiveUp, ...] = ()  # this decision's give-ups (diagnostics)
        if not give_up_sds >= 0:
            raise ValueError(f"give_up_sds must be >= 0, got {give_up_sds!r}")
        self.give_up_sds = give_up_sds
        if not join_sds >= 0:
            raise ValueError(f"join_sds must be >= 0, got {join_sds!r}")
        self.join_sds = join_sds

    # ---- per-request numbers -----------------------------------------------------------
    def _cand(self, item: RequestStatus | Request, req: Request, steps_done: int) -> Candidate:
        static = self._static.get(req.id)
        if static is None:
            static = (self.cost.tokens(req), self.cost.blocks(req.model))
            self._static[req.id] = static
        tokens, blocks = static
        tau = self.cost.step_time(req.model, [tokens])
        enc, dec = self.cost.encode_time(req), self.cost.decode_time(req)
        part = item.blocks_done / blocks if isinstance(item, RequestStatus) else 0.0
        started = steps_done > 0 or part > 0
        enc = 0.0 if started else enc
        rem = (req.steps - steps_done - part) * tau + dec + enc
        return Candidate(item, req, rem, tau, tokens, enc=enc, dec=dec)

    def _candidates(self, view: SchedulerView) -> list[Candidate]:
        if self.forecast is not None:
            self.forecast.see(view.waiting.arrived_after(self.forecast.latest))
        out = [self._cand(s, s.request, s.steps_done) for s in view.active]
        for r in view.waiting.iter_by("deadline", self.window):
            out.append(self._cand(r, r, 0))
        if self._late:  # every late request counts, inside the window or not
            seen = {c.req.id for c in out}
            for rid in self._late:
                if rid not in seen and rid in view.waiting:
                    r = view.waiting.get(rid)
                    out.append(self._cand(r, r, 0))
        if self.lone_p0_unpacked:
            self._shapes = {}
            for c in out:
                key = (c.req.model, c.tokens)
                self._shapes[key] = self._shapes.get(key, 0) + 1
        if len(self._static) > 4 * len(out) + 256:  # forget cancelled requests
            keep = {c.req.id for c in out}
            self._static = {k: v for k, v in self._static.items() if k in keep}
            alive = {s.id for s in view.active} | {r.id for r in view.waiting.iter_by("arrival")}
            self._late &= alive
        return out

    def _work(self, c: Candidate) -> float:
        """Remaining work counted against deadlines: ``rem`` less ``packing`` × the time
        its remaining steps would save at the model's best packing (same shape, max batch);
        with ``lone_p0_unpacked``, a priority-0 request no other candidate shares a shape
        with counts its batch-1 ``rem``."""
        if self.packing <= 0 or not self.batching:
            return c.rem
        if self.lone_p0_unpacked and c.req.priority == 0 and (
            self._shapes.get((c.req.model, c.tokens), 0) < 2
        ):
            return c.rem
        key = (c.req.model, c.tokens)
        gain = self._gain.get(key)
        if gain is None:  # in the profile's units (``CostModel.base_step_time``)
            b, base = self.cost.max_batch(c.req.model), self.cost.base_step_time
            gain = 1.0 - base(c.req.model, [c.tokens] * b) / (b * base(c.req.model, [c.tokens]))
            gain = self._gain[key] = max(0.0, gain)
        steps = c.rem - c.enc - c.dec
        return c.rem - self.packing * gain * steps

    def _capacity(self, delta: float, now: float, priority: int, margin: float = 0.0,
                  due: float | None = None) -> float:
        """Device seconds left to present work within ``delta`` seconds for a request of
        ``priority``: the lane's as-late-as-possible schedule takes the work it must do by
        then (of requests not counted in ``self._skip``), future arrivals that could outrank
        it are expected to take their share (``forecast``: for the top class only, or
        for every priority, or none), and a ``margin`` fraction is kept spare. With
        ``see_decodes``, the pending decodes due before ``due`` (the request's deadline,
        default ``now + delta``) take theirs: after a step of T s the window is
        ``delta - T`` but the decodes due before the deadline still run in it."""
        cap = delta * (1.0 - margin) - self.lane.forced(now, delta, self._skip)
        until = now + delta if due is None else due
        for decode_due, seconds in self._decodes:
            if decode_due >= until:
                break
            cap -= seconds
        if self.forecast is not None and (
                self._forecast_all or priority <= (self.forecast.top_priority() or 0)):
            # (no arrival seen yet: the forecast is 0 anyway)
            cap -= self.forecast.work_before(delta, now)
        return cap

    # ---- the decision ------------------------------------------------------------------
    def _classify(self, now: float, view: SchedulerView, cands: list[Candidate]) -> list[Candidate]:
        """Mark late requests (for good); return the on-time ones by deadline, with slack
        and guard set."""
        ontime, fresh = [], []
        for c in cands:
            c.late = c.req.id in self._late or now + c.rem > c.req.deadline
            if c.late and c.req.id not in self._late:
                fresh.append(c)
            elif not c.late:
                ontime.append(c)
        ontime.sort(key=lambda c: (c.req.deadline, c.req.arrival))
        heap: list[tuple[float, int, Candidate]] = []
        spare0 = None
        if self.forecast_shield0:
            def spare0(v: Candidate) -> float:
                d = v.req.deadline - now
                return self.forecast.work_before(d, now, 2) - self.forecast.work_before(d, now, 0)
        work = spread = 0.0
        given_up = len(fresh)
        self._skip = set()  # the deadline prefix: its work is in ``work``, not in the lane's
        for n, c in enumerate(ontime):
            w = self._work(c)
            work += w
            spread += w * self._spread(c)
            self._skip.add(c.req.id)
            heapq.heappush(heap, (-_give_up_key(c), n, c))
            while heap and work > (cap := self._capacity(c.req.deadline - now, now, c.req.priority)
                                   ) + self.give_up_sds * spread:
                victim = set_aside(heap, work - cap, self.shield0, spare0)
                if victim is None:  # the overrun is forecast work that yields to priority 0
                    break
                victim.late = True
                fresh.append(victim)
                self._skip.discard(victim.req.id)
                wv = self._work(victim)
                work -= wv
                spread -= wv * self._spread(victim)
        if self.take_back and len(fresh) > given_up:
            self._take_back(now, ontime, fresh[given_up:])
            fresh = fresh[:given_up] + [c for c in fresh[given_up:] if c.late]
        self.gave_up = tuple(GiveUp(c.req.id, c.rem, c.req.deadline - now, n < given_up)
                             for n, c in enumerate(fresh))
        for c in fresh:
            self._late.add(c.req.id)
            self.lane.add_late(c, now)
        if fresh and self.lane.rule == "late":
            self.lane.settle(now, view, {c.req.id: c for c in cands}, self._decoding)
        ontime = [c for c in ontime if not c.late]
        work, guard = 0.0, INF
        self._skip = set()
        for c in ontime:
            c.guard = guard
            work += self._work(c)
            self._skip.add(c.req.id)
            c.slack = self._capacity(c.req.deadline - now, now, c.req.priority) - work
            guard = min(guard, c.slack)
        return ontime

    def _fits(self, now: float, ontime: list[Candidate]) -> bool:
        """Does every deadline prefix of the on-time (not ``late``) requests of ``ontime``
        (in deadline order) stay within its capacity (``_capacity``)?"""
        work = spread = 0.0
        self._skip = set()
        for c in ontime:
            if c.late:
                continue
            w = self._work(c)
            work += w
            spread += w * self._spread(c)
            self._skip.add(c.req.id)
            cap = self._capacity(c.req.deadline - now, now, c.req.priority)
            if work > cap + self.give_up_sds * spread + 1e-9:
                return False
        return True

    def _spread(self, c: Candidate) -> float:
        """The relative spread of ``c``'s step times (``CostModel.step_spread``)."""
        return self.cost.step_spread(c.req.model, c.tokens)

    def _take_back(self, now: float, ontime: list[Candidate], victims: list[Candidate]):
        """Un-set-aside ``victims`` (set aside in this decision, ``late`` True), least
        remaining work per weight**``GIVE_UP_POWER`` first, each whose return keeps
        ``_fits``; returns those taken back."""
        back = []
        for v in sorted(victims, key=_give_up_key):
            v.late = False
            if self._fits(now, ontime):
                back.append(v)
            else:
                v.late = True
        return back

    def _pending_decodes(self, now: float, view: SchedulerView) -> list[tuple[float, float]]:
        """(deadline, predicted seconds left) of each pending tiled decode that can still
        meet its deadline, by deadline (``see_decodes``; else none)."""
        if not self.see_decodes:
            return []
        out = []
        for d in view.decodes:
            left = self.cost.decode_time(d.request) * d.tiles_left / max(1, d.tiles)
            if now + left <= d.request.deadline:
                out.append((d.request.deadline, left))
        return sorted(out)

    def schedule(self, now: float, view: SchedulerView) -> StepPlan:
        self.gave_up = ()
        self._decodes = self._pending_decodes(now, view)
        cands = self._candidates(view)
        by_id = {c.req.id: c for c in cands}
        self.lane.see(view, self.cost)
        self._decoding = {d.request.id: self.cost.decode_time(d.request) * d.tiles_left
                          / max(1, d.tiles) for d in view.decodes if d.request.id in self.lane}
        self.lane.settle(now, view, by_id, self._decoding)
        ontime = self._classify(now, view, cands) if cands else []
        late = [c for c in cands if c.late]
        plan = self._plan(now, view, ontime, late)
        if len(self.lane) and not self._keeps_promises(view, by_id, plan):
            plan = self._promise_plan(now, view, by_id, ontime, late) or plan
        if self.late_tile_margin is not None:
            plan.late_tiles_s = self._late_tile_spare(ontime)
        plan.first_decodes = tuple(rid for rid in plan.batch
                                   if rid in self.lane and rid in by_id
                                   and is_last_step(by_id[rid]))
        if len(self.lane) and view.decodes and not plan.idle:
            plan.hold_tiles = self._hold_tiles(view, by_id, plan, ontime)
        if self._decoding:
            plan.yield_s = max(0.0, self.lane.slack())
        return self.with_pause(plan, view)

    def _hold_tiles(self, view, by_id: dict[str, Candidate], plan: StepPlan,
                    ontime: list[Candidate]) -> bool:
        """Run ``plan`` before any pending decode tile? Lane members' decodes (listed in
        ``first_decodes`` at their last step) run first, tile by tile; the plan goes ahead
        of them where it keeps every promise (theirs included) and either an on-time
        request cannot spare their seconds (its slack is below what they have left) or
        their next tile would break an earlier member's promise. Any other tile waits where
        running it ahead would break a promise."""
        if not self._decoding:
            return not self._keeps_promises(view, by_id, plan, self._next_tile(view))
        if not self._keeps_promises(view, by_id, plan):
            return False
        tight = min((c.slack for c in ontime), default=INF)
        if tight < sum(self._decoding.values()):
            return True
        # the loop's first-going decode: the earliest-deadline one (view.decodes is in that order)
        first = next(d.request for d in view.decodes if d.request.id in self._decoding)
        tile = max(self.cost.decode_tiles(first), default=0.0)
        return not self.lane.allows(tile, {first.id: tile})

    def _next_tile(self, view: SchedulerView) -> float:
        """The longest tile a pending decode may run ahead of the plan (s; the cost model's)."""
        return max((max(self.cost.decode_tiles(d.request), default=0.0) for d in view.decodes),
                   default=0.0)

    def _late_tile_spare(self, ontime: list[Candidate]) -> float:
        """Seconds of late decode tiles this decision can spare (``late_tile_margin``):
        the least on-time slack beyond ``late_tile_margin`` × its SLO window, and no more
        than the least lane slack (a tile takes from every promise too), at least 0; 0 when
        nothing is on time (late steps and late tiles then share the loop as before: a
        grant there cost 0.5 point on the demo traces, as late requests that can still
        make it alone lost their turn)."""
        m = self.late_tile_margin
        spare = min((c.slack - m * (c.req.deadline - c.req.arrival) for c in ontime),
                    default=0.0)
        return max(0.0, min(spare, self.lane.slack()))

    def _keeps_promises(self, view, by_id: dict[str, Candidate], plan: StepPlan,
                        before: float = 0.0) -> bool:
        """Does ``plan`` leave every lane slack >= 0 (``tail_lane``), after ``before``
        seconds of other work ahead of it?"""
        work = {rid: member_work(by_id[rid], plan) for rid in plan.batch if rid in by_id}
        return self.lane.allows(before + plan_seconds(self.cost, view, by_id, plan), work)

    def _promise_plan(self, now, view, by_id, ontime, late) -> StepPlan | None:
        """The first of the preferred heads (alone) whose run keeps every promise; else the
        lane's head (or, when even offloading cannot make room for it, the next member
        that fits); None when none fits."""
        for n, c in enumerate(self._preference(now, ontime, late)):
            if n >= self.promise_tries:
                break
            plan = self._head_plan(now, view, by_id, c, ontime, late)
            if plan is not None and self._keeps_promises(view, by_id, plan):
                return plan
        active = {s.id: s for s in view.active}
        for rid in self.lane.ids():
            if rid in self._decoding:
                return StepPlan()  # nothing stepped: the loop runs its decode's next tile
            item = active.get(rid) or (view.waiting.get(rid) if rid in view.waiting else None)
            if item is None:
                continue
            c = by_id.get(rid)
            if c is not None:
                plan = self._head_plan(now, view, by_id, c, ontime, late)
                if plan is not None and self._keeps_promises(view, by_id, plan):
                    return plan
            plan = StepPlan()
            if self._fit(view, item, plan):
                return plan
        return None

    def _head_plan(self, now, view, by_id, head: Candidate, ontime, late) -> StepPlan | None:
        """``head`` with the joiners ``_fill_batch`` takes, if that keeps every promise, else
        alone; None when it does not fit."""
        if self.batching and not group_of(head.item, view):
            plan = StepPlan()
            if self._fit(view, head.item, plan):
                self._fill_batch(now, view, plan, head, ontime, late)
                if len(plan.batch) > 1 and self._keeps_promises(view, by_id, plan):
                    return plan
        plan = StepPlan()
        return plan if self._fit(view, head.item, plan) else None

    def _fit(self, view: SchedulerView, item, plan: StepPlan) -> bool:
        """Put ``item`` (and, for a part-done step, its group) in ``plan``, making room."""
        members = group_of(item, view) or [item]
        return make_room(self.cost, view, members, plan, victim_order=self._victim_order)

    def _plan(self, now, view, ontime: list[Candidate], late: list[Candidate]) -> StepPlan:
        plan = StepPlan()
        running = running_step(view)
        if running and self._keep_running(view, running, ontime):
            if make_room(self.cost, view, running, plan, victim_order=self._victim_order):
                return plan
        for head in self._preference(now, ontime, late):
            group = group_of(head.item, view)
            if group:
                if make_room(self.cost, view, group, plan, victim_order=self._victim_order):
                    break
            elif make_room(self.cost, view, [head.item], plan, victim_order=self._victim_order):
                if self.batching:
                    self._fill_batch(now, view, plan, head, ontime, late)
                break
        return plan

    def chunk_blocks(self, members: list[Request]) -> int:
        """Blocks per chunk: at least the cost model's choice (overhead and restore bound),
        and as many more as the wait of the most pressed recent arrival allows."""
        least = super().chunk_blocks(members)
        slack = self.forecast.min_slack() if self.forecast is not None else None
        if self.fixed_chunk is not None or slack is None:
            return least
        model = members[0].model
        blocks = self.cost.blocks(model)
        block_s = self.cost.step_time(model, [self.cost.tokens(r) for r in members]) / blocks
        affordable = int(self.chunk_wait_share * max(slack, 0.0) / block_s) if block_s > 0 else 0
        return min(blocks, max(least, affordable))

    def _keep_running(self, view, running: list[RequestStatus], ontime: list[Candidate]) -> bool:
        """Finish the running part-done step unless an on-time request served before it
        would lose its slack waiting for the rest (``inside_step.keep_running``)."""
        ids = {s.id for s in running}
        before = []
        for c in ontime:
            if c.req.id in ids:
                break
            before.append(c.slack)
        return keep_running(self.cost, view, running, before)

    def _preference(self, now: float, ontime: list[Candidate], late: list[Candidate]):
        """Heads to try, best first (later ones only matter when memory blocks earlier)."""
        first = rescued(ontime, self.rescue0, self.rescue_guard) if self.rescue0 > 0 else None
        if first is not None:
            yield first
        yield from (c for c in ontime if c is not first)
        if self.late_rank == "arrival":
            yield from sorted(late, key=lambda c: c.req.arrival)
            return
        pos = self.lane.positions()
        behind = len(pos)  # a request the lane never saw (started by hand) goes last
        yield from sorted(late, key=lambda c: late_order(now, c, pos.get(c.req.id, behind)))

    @staticmethod
    def _victim_order(status: RequestStatus) -> tuple:
        """Offload order for paused requests: latest deadline, lowest priority first."""
        return (-(status.request.deadline or 0.0), -status.request.priority)

    # ---- batching ----------------------------------------------------------------------
    def _fill_batch(self, now, view, plan, head: Candidate, ontime, late) -> None:
        cost = self.cost
        model = head.req.model
        limit = cost.max_batch(model)
        batch, step = [head], head.tau
        base = cost.base_step_time
        base_step = base(model, [head.tokens])
        others = sorted(
            (
                c
                for c in ontime + late
                if c.req.model == model
                and c is not head
                and not is_part_done(c.item)
                and c.req.id not in plan.offload  # moved out to make room for the head
            ),
            key=lambda c: (c.late, c.req.deadline),
        )
        for c in others:
            if len(batch) >= limit:
                break
            tokens = [m.tokens for m in batch] + [c.tokens]
            new_base = base(model, tokens)
            if new_base - base_step > (1.0 - self.min_gain) * base(model, [c.tokens]):
                continue
            # never shorter than without the joiner, nor than the joiner's own step: the
            # packed step's correction is its class's, learned on other mixes
            new_step = max(cost.step_time(model, tokens), step, c.tau)
            trial = batch + [c]
            if self._batch_fits(now, trial, new_step, ontime) and make_room(
                cost, view, [c.item], plan, victim_order=self._victim_order
            ):
                batch, step, base_step = trial, new_step, new_base

    def _batch_fits(
        self, now: float, batch: list[Candidate], step: float, ontime: list[Candidate]
    ) -> bool:
        """After one step of ``batch`` (``step`` seconds), is every on-time request at least as
        feasible as after one step of the head alone (deadline order, remaining work), or
        left with slack of at least 0 — for priority 0, ``join_margin0`` × its remaining
        work (s)?"""
        head, members = batch[0], {id(c): c for c in batch}
        work_b = work_h = 0.0
        for c in ontime:
            rem = c.rem
            work_b += rem - (c.tau if id(c) in members else 0.0)
            work_h += rem - (c.tau if c is head else 0.0)
            delta = c.req.deadline - now
            due = c.req.deadline
            after_batch = self._capacity(delta - step, now, c.req.priority, due=due) - work_b
            after_head = self._capacity(delta - head.tau, now, c.req.priority, due=due) - work_h
            keep = self.join_sds * self._spread(c) * rem
            if c.req.priority == 0:
                keep = max(keep, self.join_margin0 * rem)
            if after_batch < min(keep, after_head) - 1e-9:
                return False
        return True

    def late_ids(self) -> tuple[str, ...]:
        """The ids of the requests set aside as late (given up for good, not yet finished):
        in tail-lane order where the lane holds them (``tail="late"``), the rest by id.
        (With ``tail="fifo"`` the lane holds every promised arrival, late or not.)"""
        lane = tuple(i for i in self.lane.ids() if i in self._late)
        return lane + tuple(sorted(self._late.difference(lane)))

    def observe(self, report: StepReport) -> None:
        super().observe(report)
        for rid in report.finished:
            self._static.pop(rid, None)
            self._late.discard(rid)
