"""``slo`` on a node: who runs each step, on which group, at which sequence-parallel degree.

Decided whenever devices are idle and something changed (an arrival, a step's end), over
the paused started requests and the first ``window`` waiting ones by deadline:

0. **The FIFO promise** (``guard``, off by default; ``promise.FifoPromise``). Every arrival
   is promised a finish from a shadow of the best static FIFO deployment (``guard_degree``,
   ``guard_quantile``, ``guard_floor``; gated by ``guard_load``); a request whose latest
   start for keeping every promise falls within one of its steps (``guard_margin``) is
   *critical* and is placed first, at the least degree that still keeps its promise (the
   largest free one when none does; with a latency ``goal``, at least the degree that
   still reaches the goal where a group of it is free: a wider group keeps the promise
   too), after only the starving requests and the on-time ones of priority ≤
   ``guard_yield_priority`` within ``guard_yield`` of their SLO window from missing it
   (default: priority 0 with a quarter of its window left). It keeps the maximum under
   FIFO's at ρ 0.7 on 8 × h200, but costs attainment at high load and on small nodes,
   hence off (docs/results/node.md, sessions 4, 25–27).

1. **Degree needed.** For each request, the least degree d whose predicted time alone
   from now meets its deadline; its *work* is d × that time (device-seconds).
2. **Give up early (node capacity).** On-time requests by deadline, running ones included,
   their work summed; where the sum exceeds D × the time to a deadline (minus the expected
   work of earlier-due future arrivals, learned online), the request with the most work
   per weight is set aside as late (Moore–Hodgson, priorities 3:2:1). A request that
   cannot make it even at the largest degree is late too. Late requests still run, after
   on-time ones (those still able to finish at the node's best degree first, then the
   shortest per weight); one overdue by ``AGING`` (10) SLO windows goes first (no
   starvation).
3. **Urgent first.** On-time requests with less than ``URGENT`` (0.35) of their SLO window
   left as slack are placed first, by deadline, at their needed degree.
4. **Parallel targets.** The ``LONGEST`` (2) requests that scale (degree 4 at parallel
   efficiency ≥ ``EFFICIENCY``, 0.65), largest per-step time first (the large tier, whose run
   time sets the P95; earliest deadline within a tier), get
   the largest degree of at least that efficiency that leaves every other on-time request
   feasible on the devices left while it runs (device-seconds by deadline) — on their own
   group when free, else the largest free group of degree ≥ 2. A target that finds no
   group waits for the next step boundary instead of starting small.
   **Latency goal** (``goal`` > 0, off by default): the P95 of a mix is the run time of
   its largest tier, so step 4 may instead aim each scaling request at finishing within
   ``goal`` × its SLO window. Those that still can (the least degree of efficiency ≥
   ``EFFICIENCY`` meeting the goal with ``margin``) are targets by goal (i.e. by
   arrival within a tier) at that least degree, while the node's D devices last and
   ``_fits`` holds; a target whose group is not free reserves it (its own group's
   enclosing one when free of this decision's jobs, never one holding another scaling
   request's state) and waits for it rather than starting smaller. One that had a
   reachable goal and lost it goes right after the targets, by arrival (not overtaken
   by every smaller request due earlier: those keep their deadlines through steps 2–3).
   Where no request can reach its goal nothing changes (the two-device demo at 0.17 or
   0.21: a degree-2 run there takes ≥ 0.74 of the time alone, over 0.63 of it). On 8 ×
   h200 at ρ 0.7 (5 × 2,000, seeds 0–4, noise on) ``goal=0.17`` takes seed-mix's P95
   from 26.5 to 23.5 s (0.48 × fifo d=1's 49.0 s; the 2048² tier's steps at degree 4
   are as many, 38 → 39 %, but go to the requests that can still reach the goal, and those
   at degree 1, 18 → 25 %, to the rest; preemptions 0.43 → 0.74 per request), P99 50.0
   → 50.2 s, max 95.8 → 94.5 s, but raises omni-mix's 18.2 →
   19.5 s: its P95 lies at the large tier's 67th percentile, not its median, and about
   half of that tier reaches the goal. ``goal=0.21`` takes omni-mix's to 17.1 s (0.61 ×)
   and its max 54.6 → 46.8 s and leaves seed-mix's at 27.4 s. No one value helps both,
   hence off (session 10, benchmarks/scheduler/results/node_goal_s10.json).
   **Measured per-tier goal** (``tier_goal``, off by default): the goal is not a set
   fraction but measured (``tier_goal.TierGoals``): the tier where the P95 lies (by the
   arrival shares: seed-mix's 2048², omni-mix's 1536²) gets as its goal the quantile of
   its own last ``tier_goal_window`` latencies at which the P95 sits within it (the
   2048²'s median, the 1536²'s 67th percentile); other tiers none; and none while the
   measured arrival rates × work, that tier at degree 2, exceed the node's devices (the
   fluid limit). On 8 × h200 at ρ 0.7 (5 × 2,000, noise on) P95 26.5 → 26.0 s on
   seed-mix and 18.2 → 17.1 s on omni-mix (docs/results/node.md, Session 12).
5. **The rest by deadline** (key arrival + ``order_slack`` × the SLO window: 1, the
   default, is by deadline; 0 by arrival) at their needed degree (a larger free group when
   the needed one is not free). By arrival, deadlines are still kept by steps 2 and 3, and
   a large request (a 2048², SLO 146 s) is no longer overtaken by every small one arriving
   for two minutes: on 8 × h200 (5 × 2,000, ρ 0.7) P99 48.4 vs 50.0 s and max 95.0 vs
   95.8 s on seed-mix, P99 28.9 vs 32.0 s and max 46.2 vs 54.6 s on omni-mix, P95 and
   attainment unchanged. But on the two-device demo's trace (30 traces) it costs 2.6
   points (95.7 vs 98.3 %; ≥ 99 % on 1 trace instead of 14; why is not diagnosed). Hence
   by deadline by default; the figures of both are in docs/results/node.md, Session 7.
   An on-time request needing d > 1 that finds no group reserves the group of d that
   frees soonest (nothing else is placed there this decision). Then late ones.
6. **Batch when short of devices.** Requests left without a device join a degree-1 step of
   the same model while the step grows by less than ``1 − min_gain`` of the joiner's own
   step and every member still meets its deadline. On h200 a joiner saves a fixed share
   of its own step whatever it joins (512² 30 %, 768² 16 %, 1024² 9.5 %, 1536² 3.9 %),
   so ``min_gain`` 0.1 (the default) keeps the 1024² tier, 45 % of omni-mix, out of every
   batch. ``min_gain`` 0.05 lets it in: near saturation throughput sets the goodput, and
   omni-mix's (8 × h200, 2 × 2,000, noise on) goes 0.994 → 1.013 with the ρ 0.7 tails no
   worse; but on the two-device demo's 30 traces attainment falls 98.31 → 97.78 % (≥ 99 %
   on 12 traces instead of 15), hence not the default (session 9,
   benchmarks/scheduler/results/node_omni_goodput_s9.json).
7. **Spare devices shorten the longest work.** Devices still free go, by doubling, to the
   placed request with the longest remaining time whose buddy group is free (they would
   idle otherwise; the next arrival waits at most one step). Degrees change at every step;
   a paused request resumes on any group (peer copy, re-sharding), and memory is made by
   parking paused requests on the host (``Placer``).

**Long decodes.** A job ends with the decodes of the members whose last step it runs,
single-device stages run round-robin over its group (on the two-device demo's CPU profile a
1024² decode lasts 20 of its steps and a 512²'s 40; on h200 a seventh of a step); each
device goes back as its own decodes end. So a batch join counts the decodes of the members
finishing no later on its degree-1 step (``_decodes_before``); and a job waits (the decode
guard, ``_holds_back``) where, while it runs, every device outside its group would be held
(running, or given a job in this decision) past the slack of a request that then finds no
device: an on-time one due earlier and not placed yet (the urgent rule would otherwise put
a long last step before it), or, for a last step not urgent, the next arrival (the tightest
slack seen). Two 1024² decodes at once on the demo's two devices made every small arrival
meanwhile miss. Seed-mix ÷ 2 on the demo's profiles, 10 seeds: attainment 91.0 → 98.3 %
(docs/results/node.md, Session 6); on 8 × h200 no change beyond noise. Both were options
until session 17 (each off: 97.56 % and 97.22 % against 98.18 % on 30 demo traces,
docs/results/parallel.md, Session 7). Until session 7 a job held its whole group until
every decode in it ended, and a last step with a long decode also ran at degree 1 (a
degree-2 one idled the second device for the decode); with each device handed back as its
work ends that cap no longer helped (30 demo traces: 12 → 14 at ≥ 99 %, mean 98.18 →
98.29 % without it; docs/results/parallel.md, Session 7) and is gone.

A move needs every device it reads from and writes to. A paused request whose state is on
devices still running another job's step (``Placer.stuck``) goes to a group holding those
devices when one is free; else it is moved only when the wait for that step (it idles the
new group meanwhile; the loop predicts it) is at most ``MOVE_WAIT`` (one) of its own steps
at the new degree, or at once when it is urgent or late — otherwise it waits for the next
decision (refusing every such move starves a request whose old group is never free all at
once: the maximum latency went from 66 s to 605 s in a trial; with the limit alone a 512²
spread over 8 devices waited 88 s). Such requests are never parked to make room. Moves
that read from devices this decision gives a new job go first in the plan (those jobs wait
for the copy, not the copy for their step). And a paused request whose devices this
decision gives to another job is parked on the host first, while they are free (``park``,
``Placer.park_displaced``: where the park and a later restore cost less than that job's
step) — a restore from the host waits for no device, a later move off them would wait for
the job: with moves priced so, parking cut the wait for busy devices from 1,404 s to 20 s
(seed-mix ρ 0.8, 2 × 2,000) and kept the session-4 figures.
"""

from __future__ import annotations

import heapq

from ...policies.forecast import ArrivalForecast
from ...request import Request
from ..cost import NodeCost
from ..plan import Assignment, NodePlan, NodeStatus, NodeView
from ..topology import Group, Node
from .base import NodePolicy, Placer, best_group
from .promise import FifoPromise
from .tier_goal import TierGoals, tier_of

INF = float("inf")

# Tuning numbers. Each was an option until session 17; every other value tried was no better
# (docs/results/node.md, "Session 17: options removed").
#: weight exponent of the give-up rule (step 2: priorities 3:2:1); 1 since session 20, as
#: the one-device ``slo`` (2 before: 9:4:1; docs/results/node.md, "Session 20")
GIVE_UP_POWER = 1.0
#: an on-time request with less than this fraction of its SLO window left as slack is urgent
URGENT = 0.35
#: step 4's parallel targets per decision (without a latency goal)
LONGEST = 2
#: least parallel efficiency at degree 4 for a request to scale (step 4)
EFFICIENCY = 0.65
#: SLO windows past its deadline after which a late request goes first (no starvation)
AGING = 10.0
#: longest wait for a paused request's busy devices that a move may take, in its steps at the
#: new degree (any wait when it is urgent or late)
MOVE_WAIT = 1.0


class _Cand:
    """One request as ``slo`` sees it in a decision (times in seconds)."""

    __slots__ = (
        "item", "req", "steps_left", "started", "home", "tau", "corr", "dec", "enc",
        "need", "work", "late", "cap", "promise", "lat",
    )

    def __init__(self, item, req, steps_left, started, home, tau, corr, dec, enc, lat=0.0):
        self.item, self.req, self.steps_left, self.started = item, req, steps_left, started
        self.home, self.tau, self.corr, self.dec, self.enc = home, tau, corr, dec, enc
        self.lat = lat  # the fixed seconds of each job (a job per step: NodeCost docstring)
        self.need, self.work, self.late, self.cap = 0, INF, False, 0.0
        self.promise = INF

    def step(self, k: int) -> float:
        """One step alone at the k-th node degree (``tau``: the profile's; ``corr``: the
        learned factor at each degree)."""
        return self.tau[k] * self.corr[k]

    def rem(self, k: int) -> float:
        """Seconds left alone at the k-th node degree (a job per step, each paying ``lat``)."""
        return self.steps_left * (self.tau[k] * self.corr[k] + self.lat) + self.dec + (
            0.0 if self.started else self.enc
        )


class NodeSloPolicy(NodePolicy):
    """See the module docstring. Options: ``window`` (waiting requests looked at),
    ``forecast`` (step 2's expected work of future arrivals), ``batching``, ``min_gain`` and
    ``margin`` (step 6: fraction of a member's remaining time kept spare for timing error),
    ``park`` (park displaced paused requests on the host), ``order_slack`` (step 5's order,
    in [0, 1]: 0 by arrival, 1 by deadline), ``guard``, ``guard_degree``,
    ``guard_quantile``, ``guard_margin``, ``guard_yield``, ``guard_yield_priority``,
    ``guard_floor`` and ``guard_load`` (step 0), ``goal`` (step 4's latency goal, a
    fraction of the SLO window; 0: off),
    ``tier_goal``, ``tier_goal_percentile`` and ``tier_goal_window`` (step 4's goal
    measured per tier instead: ``tier_goal.TierGoals``),
    ``split_decodes`` (on: a job with fewer decodes than devices spreads each
    decode's tiles over the spare ones: ``node.device.decode_devices``; its last job is
    then priced with the split decode) and ``split_yield`` (on: the loop may take those
    spare devices back between tiles for a request that would miss otherwise:
    ``NodePolicy.take_back``; session 9, 30 demo traces: 98.31 % attainment and P95 0.92 ×
    fifo's, against 98.13 % / 0.97 × without the split). The tuning numbers that were
    options until session 17 are the module constants above (``GIVE_UP_POWER``,
    ``URGENT``, ``LONGEST``, ``EFFICIENCY``, ``AGING``, ``MOVE_WAIT``); the rules that
    were switches (the decode guard and join count, step 5's reservation, step 7) always
    run (docs/results/node.md, "Session 17: options removed")."""

    name = "slo"

    def __init__(
        self,
        ncost: NodeCost,
        node: Node,
        *,
        window: int = 64,
        forecast: bool = True,
        batching: bool = True,
        min_gain: float = 0.1,
        margin: float = 0.1,
        park: bool = True,
        order_slack: float = 1.0,
        guard: bool = False,
        guard_degree: int = 1,
        guard_quantile: float = 1.0,
        guard_margin: float = 0.05,
        guard_yield: float = 0.25,
        guard_yield_priority: int = 0,
        guard_floor: float = 0.0,
        guard_load: float = 0.0,
        split_decodes: bool = True,
        split_yield: bool = True,
        goal: float = 0.0,
        tier_goal: bool = False,
        tier_goal_percentile: float = 95.0,
        tier_goal_window: int = 100,
    ):
        super().__init__(ncost, node)
        self.split_decodes = split_decodes
        self.split_yield = split_yield
        self.window = window
        self.forecast = ArrivalForecast() if forecast else None
        self.batching = batching
        self.min_gain = min_gain
        self.margin = margin
        self.park = park
        if not 0.0 <= order_slack <= 1.0:
            raise ValueError(f"order_slack must be in [0, 1], got {order_slack}")
        self.order_slack = order_slack
        if not 0.0 <= goal < 1.0:
            raise ValueError(f"goal must be in [0, 1), got {goal}")
        self.goal = goal
        #: ``tier_goal``: per-tier goals measured at run time (None: off)
        self.tier_goals = (
            TierGoals(tier_goal_percentile, tier_goal_window, devices=node.devices)
            if tier_goal else None
        )
        #: per decision: tier → goal latency (s) from ``tier_goals``
        self._tier_due: dict = {}
        #: per decision: (model, width, height, frames) → (step factor per node degree,
        #: decode s, encode s); the learned factors change only between decisions
        self._shape_now: dict[tuple, tuple] = {}
        #: ids of the requests that have had a reachable goal (``_goal_targets``)
        self._goal_seen: set[str] = set()
        #: per decision: scaling requests whose goal is lost, and the goal targets
        self._goal_lost: list[_Cand] = []
        self._goal_ids: set[int] = set()
        #: the least slack (SLO window − time alone at the node's best degree) of the
        #: requests seen: how long a new arrival may wait for a device
        self._tight = INF
        #: per device, when it can next start a new job (``_holds_back``; per decision)
        self._until: list[float] = []
        self._now = 0.0
        self._due: list[_Cand] = []
        #: ids counted late in the last decision (``late_ids``)
        self._late: tuple[str, ...] = ()
        self._static: dict[str, tuple] = {}
        self.guard = guard
        self.guard_yield = guard_yield
        self.guard_yield_priority = guard_yield_priority
        #: step 0's promises (validated and kept even with the guard off, then empty)
        self.promise = FifoPromise(ncost, node, degree=guard_degree, quantile=guard_quantile,
                                   margin=guard_margin, floor=guard_floor, load=guard_load)
        # Degree 4 (or the node's largest below it) decides whether a request "scales".
        self._k4 = min(2, len(node.degrees) - 1)

    # ---- numbers -----------------------------------------------------------------------
    def _cand(self, item, req: Request, steps_done: int, home: Group | None, now: float):
        ncost = self.ncost
        base = self._static.get(req.id)
        if base is None:
            base = tuple(ncost.base_alone_step(req, d) for d in self.node.degrees)
            self._static[req.id] = base
        shape = (req.model, req.width, req.height, req.frames)
        per = self._shape_now.get(shape)
        if per is None:
            tokens = [ncost.cost.tokens(req)]
            per = self._shape_now[shape] = (
                tuple(ncost.step_correction(req.model, tokens, d) for d in self.node.degrees),
                ncost.decode_time(req), ncost.encode_time(req))
        corr, dec, enc = per
        c = _Cand(item, req, req.steps - steps_done, steps_done > 0, home, base, corr, dec, enc,
                  ncost.job_latency_s)
        budget = req.deadline - now
        for k, d in enumerate(self.node.degrees):
            rem = c.rem(k)
            if rem <= budget:
                c.need, c.work = d, d * rem
                break
        else:
            c.late = True
        return c

    def _capacity(self, delta: float, now: float) -> float:
        cap = self.node.devices * delta
        if self.forecast is not None:
            cap -= self.forecast.work_before(delta, now)
        return cap

    def _classify(self, now: float, ontime: list[_Cand]) -> list[_Cand]:
        """Step 2 over ``ontime`` (by deadline; sets each one's capacity); returns those
        still on time."""
        heap: list[tuple[float, int, _Cand]] = []
        work = 0.0
        for n, c in enumerate(ontime):
            c.cap = self._capacity(c.req.deadline - now, now)
            work += c.work
            heapq.heappush(heap, (-c.work / c.req.weight**GIVE_UP_POWER, n, c))
            while heap and work > c.cap + 1e-9:
                victim = heapq.heappop(heap)[2]
                victim.late = True
                work -= victim.work
        return [c for c in ontime if not c.late]

    # ---- the decision ------------------------------------------------------------------
    @property
    def promises(self) -> dict[str, float]:
        """Step 0's promised finish per request id (s; empty with the guard off)."""
        return self.promise.promises

    def _critical_all(self, now, view, cands, running) -> list[_Cand]:
        """Step 0's check over ``cands`` (paused and the deadline window) and the first
        ``window`` waiting by arrival: the critical ones, by promise."""
        seen = {c.req.id for c in cands}
        extra = [
            self._cand(r, r, 0, None, now)
            for r in view.waiting.iter_by("arrival", self.window)
            if r.id not in seen
        ]
        return self.promise.critical(now, cands + extra + running)

    def _place_promised(self, now, placer, critical, placed, done) -> None:
        """Step 0's placement: each at the least degree keeping its promise, else any; one
        that can still reach its latency goal at its goal degree (else the widest free one
        down to the promise's) first."""
        for c in critical:
            if id(c) in done or not placer.available:
                continue
            degree = self._promise_degree(now, c)
            wide = self._goal_degree(now, c)
            if wide > degree and self._place_target(placer, c, wide, placed, degree):
                done.add(id(c))
                continue
            a = self._place(placer, c, degree) or self._place(placer, c, 1)
            if a is not None:
                placed.append((a, [c]))
                done.add(id(c))

    def _goal_due(self, r: Request) -> float | None:
        """When ``r`` should finish by its latency goal (s): arrival + its tier's measured
        goal (``tier_goal``) or + ``goal`` × its SLO window; None without one."""
        if self.tier_goals is not None:
            g = self._tier_due.get(tier_of(r))
            return None if g is None else r.arrival + g
        if self.goal > 0:
            return r.arrival + self.goal * (r.deadline - r.arrival)
        return None

    def _goal_degree(self, now: float, c: _Cand) -> int:
        """The least degree (of parallel efficiency >= ``EFFICIENCY``, at least its need)
        at which scaling ``c`` still finishes by its latency goal with ``margin`` (step 4);
        1 without a goal, for a request that does not scale, or when none does."""
        due = self._goal_due(c.req)
        if due is None or not self._scales(c):
            return 1
        k = self._goal_k(now, c, due, 0)
        return 1 if k is None else self.node.degrees[k]

    def _goal_k(self, now: float, c: _Cand, due: float, first: int) -> int | None:
        """The index of the least node degree from the ``first``-th on, of parallel
        efficiency >= ``EFFICIENCY`` and at least ``c``'s need, at which ``c`` finishes by
        ``due`` with ``margin``; None when none does."""
        degrees = self.node.degrees
        for k in range(first, len(degrees)):
            if c.tau[0] / c.tau[k] / degrees[k] < EFFICIENCY:
                return None
            if degrees[k] >= c.need and now + c.rem(k) * (1.0 + self.margin) <= due:
                return k
        return None

    def _promise_degree(self, now: float, c: _Cand) -> int:
        """The least degree that still keeps ``c``'s promise as predicted (the margin only
        makes it critical sooner; the largest degree when none does)."""
        for k, d in enumerate(self.node.degrees):
            if now + c.rem(k) <= c.promise + 1e-9:
                return d
        return self.node.degrees[-1]

    def late_ids(self) -> tuple[str, ...]:
        """The ids the last decision counted late: not able to meet their deadline at the
        node's largest degree, or set aside by the give-up rule (running ones included)."""
        return self._late

    def schedule(self, view: NodeView) -> NodePlan:
        now = view.now
        self._shape_now = {}
        if self.guard:
            self.promise.see(view)
        if self.forecast is not None:
            self.forecast.see(view.waiting.arrived_after(self.forecast.latest))
        if self.tier_goals is not None:
            tg = self.tier_goals
            wide = self.node.degrees[min(1, len(self.node.degrees) - 1)]
            for r in view.waiting.arrived_after(tg.latest):
                tg.see(r, self.ncost.standalone(r, 1, 1),
                       wide * self.ncost.standalone(r, wide, 1))
            self._tier_due = tg.goals()
        cands = [self._cand(s, s.request, s.steps_done, s.group, now) for s in view.paused]
        cands += [
            self._cand(r, r, 0, None, now) for r in view.waiting.iter_by("deadline", self.window)
        ]
        best = len(self.node.degrees) - 1
        for c in cands:
            if not c.started:
                window = c.req.deadline - c.req.arrival
                slack = window - c.steps_left * (c.step(best) + c.lat) - c.dec - c.enc
                if slack > 0:  # one that cannot make it alone is late: it finds no
                    self._tight = min(self._tight, slack)  # device in time anyway
        self._now = now
        # Only running jobs hold a device (each ends in a completion, so a request held
        # back is decided on again; a predicted send may outlast its job).
        self._until = [now] * self.node.devices
        for s in view.running:
            if s.group is not None:
                for d in s.group.devices:
                    self._until[d] = max(self._until[d], s.job_end)
        running = [
            self._cand(s, s.request, s.steps_done + 1, s.group, now) for s in view.running
        ]
        ontime = [c for c in cands + running if not c.late]
        ontime.sort(key=lambda c: (c.req.deadline, c.req.arrival))
        everyone = self._classify(now, ontime)  # on time, running ones included
        self._late = tuple(c.req.id for c in cands + running if c.late)
        ontime = [c for c in everyone if not isinstance(c.item, NodeStatus) or not c.item.running]
        self._due = ontime
        late = sorted((c for c in cands if c.late), key=lambda c: self._late_key(now, c))
        placer = Placer(view, self.ncost)
        placed: list[tuple[Assignment, list[_Cand]]] = []
        done: set[int] = set()
        starving = [c for c in late if self._starving(now, c)]
        urgent = [c for c in ontime if self._urgent(now, c)]
        left: list[_Cand] = []
        critical = (self._critical_all(now, view, cands, running)
                    if self.guard and self.promise.acts(now) else [])
        if critical and self.guard_yield > 0:
            # On-time requests of priority <= ``guard_yield_priority`` within ``guard_yield``
            # of their SLO window from missing it go before the promises.
            tight = [
                c for c in urgent
                if c.req.priority <= self.guard_yield_priority
                and self._urgent(now, c, self.guard_yield)
            ]
            left += self._place_all(placer, view, starving + tight, placed, done)
        self._place_promised(now, placer, critical, placed, done)
        left += self._place_all(placer, view, starving + urgent, placed, done)
        self._goal_ids, self._goal_lost = set(), []
        targets = self._targets(now, ontime, everyone) if not starving else []
        for c, degree in targets:
            goal = id(c) in self._goal_ids
            if id(c) in done:
                continue
            if self._place_target(placer, c, degree, placed, degree if goal else 2):
                done.add(id(c))
            elif goal and self._reserve(placer, view, degree, c.home,
                                        self._scaling_homes(c, running)):
                done.add(id(c))  # it waits for its group instead of starting smaller
        if self._goal_lost:
            lost = sorted(self._goal_lost, key=lambda c: c.req.arrival)
            left += self._place_all(placer, view, lost, placed, done)
        rest = [c for c in ontime if id(c) not in done]
        if self.order_slack != 1.0:
            rest.sort(key=self._rest_key)
        rest += [c for c in late if id(c) not in done]
        left += self._place_all(placer, view, rest, placed, done)
        if self.batching and left:
            self._batch(now, placer, placed, [c for c in left if id(c) not in done])
        self._upgrade(placer, placed)
        return placer.plan(park_displaced=self.park)

    def _place_all(self, placer: Placer, view: NodeView, order, placed, done) -> list[_Cand]:
        """Place ``order`` at each one's degree (late ones at 1); return those left out."""
        left: list[_Cand] = []
        reserved = False
        for c in order:
            if id(c) in done:
                continue
            if not placer.available:
                left.append(c)
                continue
            need = c.need if not c.late else 1
            a = self._place(placer, c, need)
            if a is not None:
                placed.append((a, [c]))
                done.add(id(c))
                continue
            left.append(c)
            if not c.late and need > 1 and not reserved:
                reserved = self._reserve(placer, view, need)
        return left

    def _place(self, placer: Placer, c: _Cand, need: int) -> Assignment | None:
        for d in self.node.degrees:
            if d < need:
                continue
            g = self._group(placer, c, d)
            if g is not None:
                if self._holds_back(placer, c, g):
                    return None  # a larger group leaves even fewer devices outside
                a = placer.take(g, [c.item], 1)
                if a is not None:
                    self._hold(c, g)
                return a
        return None

    def _job_s(self, c: _Cand, degree: int) -> float:
        """Predicted seconds of ``c``'s next job alone at ``degree``: one step, and its
        decode (on one device of the group, its decode lane) when that step is its last,
        and the job's fixed ``lat``."""
        if c.steps_left != 1:
            return c.step(self.node.degrees.index(degree)) + c.lat
        return c.step(self.node.degrees.index(degree)) + self._decode_s(c, degree) + c.lat

    def _decode_s(self, c: _Cand, degree: int) -> float:
        """Seconds of ``c``'s decode after a last step alone at ``degree``: on one device,
        or with ``split_decodes`` its tiles over the group and the lane's blend."""
        if not self.split_decodes or degree == 1:
            return c.dec
        parts, blend = self.ncost.decode_parts(c.req, degree)
        return max(parts) + blend

    def _holds_back(self, placer: Placer, c: _Cand, g: Group) -> bool:
        """The decode guard: whether ``c``'s next job on ``g`` must wait, because while it
        runs every device outside ``g`` is held (running a job, or given one in this
        decision) past the slack of a request that would then find no device in time:
        an on-time one due before ``c`` not placed yet (EDF), or — for ``c``'s last step
        and decode, unless ``c`` is urgent — the next arrival (the tightest slack seen).
        Never for a starving ``c``."""
        now = placer.view.now
        outside = [self._until[d] for d in range(self.node.devices) if not g.mask >> d & 1]
        if not outside or self._starving(now, c):
            return False  # on the whole node, waiting would only idle it
        free_at = min(outside) - now
        job = self._job_s(c, g.degree)
        if job <= free_at and job <= self._tight:
            return False
        if (c.steps_left == 1 and job > self._tight and free_at > self._tight
                and (c.late or not self._urgent(now, c))):
            return True
        degrees = self.node.degrees
        for x in self._due:
            if x.req.deadline >= c.req.deadline:
                break
            if x is c or x.req.id in placer.taken:
                continue
            slack = x.req.deadline - now - x.rem(degrees.index(x.need))
            if slack < job and free_at > slack:
                return True
        return False

    def _hold(self, c: _Cand, g: Group, seconds: float | None = None) -> None:
        """Note that ``g``'s devices run ``c``'s next job from now on (``_holds_back``)."""
        seconds = self._job_s(c, g.degree) if seconds is None else seconds
        for d in g.devices:
            self._until[d] = max(self._until[d], self._now + seconds)

    def _group(self, placer: Placer, c: _Cand, degree: int) -> Group | None:
        """A free group of ``degree`` for ``c``: one needing no wait for its state's devices
        first; else one whose move waits at most ``MOVE_WAIT`` × its step at ``degree`` — any
        wait when ``c`` is urgent or late (else a request spread over a large group could
        wait for all of it to be free at once)."""
        stuck = placer.stuck(c.item)
        g = best_group(self.node, placer, degree, c.home, stuck=stuck)
        if g is not None or not stuck:
            return g
        view = placer.view
        wait = NodeCost.move_wait(c.home, None, view.busy_until, view.now)
        if wait > MOVE_WAIT * c.step(self.node.degrees.index(degree)) and not (
            c.late or self._urgent(view.now, c)
        ):
            return None
        return best_group(self.node, placer, degree, c.home)

    def _place_target(self, placer: Placer, c: _Cand, degree: int, placed,
                      least: int = 2) -> bool:
        """Step 4's placement: at ``degree``, else the largest free degree >= ``least``
        (and >= its need); False when none is free (it then takes its turn by deadline)."""
        for d in reversed(self.node.degrees):
            if d > degree or d < max(least, c.need):
                continue
            g = self._group(placer, c, d)
            if g is not None and self._holds_back(placer, c, g):
                continue
            a = placer.take(g, [c.item], 1) if g is not None else None
            if a is not None:
                self._hold(c, g)
                placed.append((a, [c]))
                return True
        return False

    def _scales(self, c: _Cand) -> bool:
        """Whether degree 4 runs ``c`` at parallel efficiency >= ``EFFICIENCY``."""
        k = self._k4
        return k > 0 and c.tau[0] / c.tau[k] / self.node.degrees[k] >= EFFICIENCY

    def _urgent(self, now: float, c: _Cand, fraction: float | None = None) -> bool:
        """Whether ``c`` has used up all but ``fraction`` (default ``URGENT``) of its SLO
        window as slack."""
        k = self.node.degrees.index(c.need)
        fraction = URGENT if fraction is None else fraction
        return c.req.deadline - now - c.rem(k) < fraction * (c.req.deadline - c.req.arrival)

    def _targets(self, now: float, ontime: list[_Cand], everyone: list[_Cand]):
        """Step 4's choice: up to ``LONGEST`` scaling on-time requests (largest tier first,
        by deadline within it), each at the largest degree of efficiency >= ``EFFICIENCY``
        that ``_fits``."""
        if self.goal > 0 or self._tier_due:
            chosen = self._goal_targets(now, ontime, everyone)
            if chosen:
                self._goal_ids = {id(c) for c, _ in chosen}
                return chosen
        pool = sorted((c for c in ontime if self._scales(c)), key=lambda c: -c.tau[0])
        crowd = sum(self._scales(c) for c in everyone)  # scaling requests on the node
        pool = pool[:LONGEST]  # the largest tier first, by deadline within it
        chosen: list[tuple[_Cand, int, float]] = []
        degrees = self.node.degrees
        for big in pool:
            cap = self._crowd_degree(big, crowd)
            for k in range(len(degrees) - 1, 0, -1):
                d = degrees[k]
                if d <= big.need:
                    break
                if d > cap:
                    continue
                if big.tau[0] / big.tau[k] / d < EFFICIENCY:
                    continue
                trial = chosen + [(big, d, big.rem(k))]
                if self._fits(now, trial, everyone):
                    chosen = trial
                    break
        return [(c, d) for c, d, _ in chosen]

    def _goal_targets(self, now: float, ontime: list[_Cand], everyone: list[_Cand]):
        """Step 4 with ``goal``: [(request, degree)] for the scaling on-time requests that
        can still finish by arrival + ``goal`` × their SLO window, by that time, each at the
        least degree of efficiency >= ``EFFICIENCY`` that does so with ``margin``, while
        the node's devices last and ``_fits`` holds. Sets ``_goal_lost``: those that had
        a reachable goal once (``_goal_seen``) and are not targets now."""
        degrees = self.node.degrees
        pool, lost = [], []
        for c in ontime:
            if not self._scales(c):
                continue
            r = c.req
            due = self._goal_due(r)
            if due is None:
                continue  # no goal for its tier: not a target, not lost
            k = self._goal_k(now, c, due, 1)
            if k is None:
                lost.append(c)
            else:
                pool.append((due, r.arrival, r.id, c, k))
                self._goal_seen.add(r.id)
        pool.sort(key=lambda t: t[:3])
        chosen: list[tuple[_Cand, int, float]] = []
        devices = 0
        for _, _, _, c, k in pool:
            d = degrees[k]
            trial = chosen + [(c, d, c.rem(k))]
            if devices + d <= self.node.devices and self._fits(now, trial, everyone):
                chosen = trial
                devices += d
            else:
                lost.append(c)
        self._goal_lost = [c for c in lost if c.req.id in self._goal_seen]
        return [(c, d) for c, d, _ in chosen]

    def _scaling_homes(self, c: _Cand, running: list[_Cand]) -> int:
        """Device mask of the groups holding other scaling requests' state (running, or
        with their goal lost): a goal target's reservation leaves them be."""
        mask = 0
        for x in self._goal_lost + running:
            if x is not c and x.home is not None and self._scales(x):
                mask |= x.home.mask
        return mask

    def _crowd_degree(self, big: _Cand, crowd: int) -> int:
        """The degree that finishes ``crowd`` requests like ``big`` soonest on the node
        (rounds of D/d at a time × its time at d): many at once run at low degree."""
        best, best_t = 1, INF
        for k, d in enumerate(self.node.degrees):
            rounds = -(-crowd // max(1, self.node.devices // d))
            t = rounds * big.rem(k)
            if t < best_t - 1e-9:
                best, best_t = d, t
        return best

    @staticmethod
    def _fits(now: float, chosen, everyone: list[_Cand]) -> bool:
        """Whether the other on-time requests (by deadline, capacities set by
        ``_classify``) stay feasible while each chosen one holds its degree's devices for
        its time at that degree."""
        skip = {id(c) for c, _, _ in chosen}
        work = 0.0
        for c in everyone:
            if id(c) in skip:
                continue
            work += c.work
            delta = c.req.deadline - now
            held = 0.0
            for _, d, secs in chosen:
                held += d * (delta if delta < secs else secs)
            if work > c.cap - held + 1e-9:
                return False
        return True

    def _reserve(self, placer: Placer, view: NodeView, degree: int,
                 home: Group | None = None, avoid: int = 0) -> bool:
        """Hold the group of ``degree`` that frees soonest (its running jobs' latest predicted
        end; groups with devices taken in this decision or in the mask ``avoid`` are
        skipped); the one enclosing ``home`` when it is not skipped."""
        ends: dict[int, float] = {}
        for s in view.running:
            if s.group is not None:
                for dev in s.group.devices:
                    ends[dev] = max(ends.get(dev, 0.0), s.job_end)
        skip = placer.reserved | (view.free & ~placer.free) | avoid
        if home is not None and home.degree <= degree:
            g = self.node.group_of(home.first, degree)
            if not g.mask & skip:
                placer.reserved |= g.mask
                return True
        best, key = None, None
        for g in self.node.groups(degree):
            if g.mask & skip:
                continue
            k = max(ends.get(d, view.now) for d in g.devices)
            if key is None or k < key:
                best, key = g, k
        if best is None:
            return False
        placer.reserved |= best.mask
        return True

    def _batch(self, now: float, placer: Placer, placed, left: list[_Cand]) -> None:
        """Step 6: join requests left without a device to degree-1 steps of their model."""
        cost = self.ncost
        open_steps = [
            (a, m) for a, m in placed
            if a.group.degree == 1 and len(m) < cost.cost.max_batch(m[0].req.model)
        ]
        for c in left:
            if not open_steps:
                return
            if c.req.id in placer.taken:
                continue
            for a, members in open_steps:
                if members[0].req.model != c.req.model:
                    continue
                tokens = [cost.cost.tokens(m.req) for m in members]
                joined = tokens + [cost.cost.tokens(c.req)]
                old = cost.base_step_time(c.req.model, tokens, 1)
                if cost.base_step_time(c.req.model, joined, 1) - old > (
                        1.0 - self.min_gain) * c.tau[0]:
                    continue  # judged in the profile's units (NodeCost docstring)
                new = cost.step_time(c.req.model, joined, 1)
                # Every on-time member must still finish in time if the batch stays together,
                # with a margin for timing error, after the decodes of
                # the members that finish no later (on one device they run one after another).
                group = members + [c]
                if any(
                    not m.late
                    and now + (new * m.steps_left + m.rem(0) - m.step(0) * m.steps_left
                               + self._decodes_before(m, group))
                    * (1.0 + self.margin) > m.req.deadline
                    for m in group
                ):
                    continue
                if c.steps_left == 1 and self._holds_back(placer, c, a.group):
                    continue
                if self._join(placer, a, c):
                    if c.steps_left == 1:
                        self._hold(c, a.group, new + c.dec + c.lat)
                    members.append(c)
                    a.batch.append(c.req.id)
                    if len(members) >= cost.cost.max_batch(c.req.model):
                        open_steps.remove((a, members))
                    break

    def _decodes_before(self, m: _Cand, batch: list[_Cand]) -> float:
        """Seconds of the decodes of the others in ``batch`` that finish no later than ``m``
        (its own decode waits for them on a degree-1 step)."""
        return sum(x.dec for x in batch if x is not m and x.steps_left <= m.steps_left)

    def _join(self, placer: Placer, a: Assignment, c: _Cand) -> bool:
        """Add ``c`` to the assignment ``a`` (pages on its group, started cap)."""
        admit = isinstance(c.item, Request)
        if admit and placer.view.max_started is not None:
            if placer.started + 1 > placer.view.max_started:
                return False
        if c.home != a.group:
            if placer.stuck(c.item) & ~a.group.mask:
                return False  # its state is on devices still running another job
            need = self.ncost.shard_pages(c.req, 1, placer.view.page_bytes)
            if placer.pages[a.group.first] < need:
                return False
            placer.pages[a.group.first] -= need
        placer.started += admit
        placer.taken.add(c.req.id)
        return True

    def _upgrade(self, placer: Placer, placed) -> None:
        """Step 7: double the group of the longest single-request assignment while its
        buddy devices are free (and hold the pages its new shards need)."""
        singles = [(a, m[0]) for a, m in placed if len(m) == 1]
        page_bytes = placer.view.page_bytes
        degrees = self.node.degrees
        while placer.available and singles:
            best = None
            for a, c in singles:
                parent = self.node.parent(a.group)
                if parent is None or (parent.mask & ~a.group.mask) & ~placer.available:
                    continue
                pages = self.ncost.shard_pages(c.req, parent.degree, page_bytes)
                if any(placer.pages[d] < pages for d in parent.devices if d not in a.group.devices):
                    continue
                rem = c.rem(degrees.index(a.group.degree))
                if best is None or rem > best[0]:
                    best = (rem, a, parent, pages, c)
            if best is None:
                return
            _, a, parent, pages, c = best
            for d in parent.devices:
                if d not in a.group.devices:
                    placer.pages[d] -= pages
            placer.free &= ~parent.mask
            a.group = parent
            self._hold(c, parent)

    def _rest_key(self, c: _Cand) -> tuple:
        """Step 5's order: arrival + ``order_slack`` × the SLO window (1: deadline)."""
        r = c.req
        return (r.arrival + self.order_slack * (r.deadline - r.arrival), r.arrival)

    def _late_key(self, now: float, c: _Cand) -> tuple:
        lost = now + c.rem(len(self.node.degrees) - 1) > c.req.deadline
        return (lost, c.rem(0) / c.req.weight, c.req.arrival)

    def _starving(self, now: float, c: _Cand) -> bool:
        window = c.req.deadline - c.req.arrival
        return now - c.req.deadline > AGING * window

    def forget(self, request_id: str) -> None:
        self._static.pop(request_id, None)
        if self.tier_goals is not None:
            self.tier_goals.forget(request_id)
        self._goal_seen.discard(request_id)
        self.promise.forget(request_id)

    def observe(self, report) -> None:
        super().observe(report)
        for rid in report.finished:
            if self.tier_goals is not None:
                self.tier_goals.finished(rid, report.now)
            self.forget(rid)
