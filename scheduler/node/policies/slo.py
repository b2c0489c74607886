"""``slo`` on a node: who runs each step, on which group, at which sequence-parallel degree.

Decided whenever devices are idle and something changed (an arrival, a step's end), over
the paused started requests and the first ``window`` waiting ones by deadline:

1. **Degree needed.** For each request, the least degree d whose predicted time alone
   from now meets its deadline; its *work* is d × that time (device-seconds).
2. **Give up early (node capacity).** On-time requests by deadline, running ones included,
   their work summed; where the sum exceeds D × the time to a deadline (minus the expected
   work of earlier-due future arrivals, learned online), the request with the most work
   per weight² is set aside as late (Moore–Hodgson, priorities 3:2:1). A request that
   cannot make it even at the largest degree is late too. Late requests still run, after
   on-time ones (those still able to finish alone first, then the shortest per weight);
   one overdue by ``aging`` SLO windows goes first (no starvation).
3. **Place by deadline at the least degree.** Earliest deadline first, each on a free group
   of its needed degree (its own group if free, else the one that keeps larger groups whole);
   when none is free but a larger one is, the larger. An on-time request needing d > 1 that
   finds no group reserves the group of d with the fewest busy devices (nothing else is
   placed there this decision), so aligned groups do form between asynchronous steps.
4. **Batch when short of devices.** Requests left without a device join a degree-1 step of
   the same model while the step grows by less than ``1 − min_gain`` of the joiner's own
   step and every member still meets its deadline.
5. **Spare devices shorten the longest work.** Devices still free go, by doubling, to the
   placed request with the longest remaining time whose buddy group is free: that is what
   sets the P95 (the large tier's run time) and they would idle otherwise. Degrees change at
   every step; a paused request resumes on any group (peer copy, re-sharding), and memory
   is made by parking paused requests on the host.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ...policies.forecast import ArrivalForecast
from ...request import Request
from ..cost import NodeCost
from ..plan import Assignment, NodePlan, NodeStatus, NodeView
from ..topology import Group, Node
from .base import NodePolicy, Placer, best_group

INF = float("inf")


@dataclass(slots=True)
class _Cand:
    item: NodeStatus | Request
    req: Request
    steps_left: int
    started: bool
    home: Group | None
    tau: tuple[float, ...]  # one step alone at each node degree
    dec: float
    enc: float
    need: int = 0  # least degree meeting the deadline (0: none)
    work: float = INF
    late: bool = False

    def rem(self, k: int) -> float:
        """Seconds left alone at the k-th node degree."""
        return self.steps_left * self.tau[k] + self.dec + (0.0 if self.started else self.enc)


class NodeSloPolicy(NodePolicy):
    """See the module docstring. Options: ``window`` (waiting requests looked at),
    ``give_up_power`` (weight exponent of the give-up rule), ``forecast``, ``min_gain``
    (batching), ``aging`` (SLO windows), ``reserve`` (step 3's reservation), ``spare``
    (step 5), ``margin`` (fraction of each deadline's time kept spare when choosing degrees).
    """

    name = "slo"

    def __init__(
        self,
        ncost: NodeCost,
        node: Node,
        *,
        window: int = 64,
        give_up_power: float = 2.0,
        forecast: bool = True,
        min_gain: float = 0.1,
        aging: float = 10.0,
        reserve: bool = True,
        spare: bool = True,
        batching: bool = True,
        margin: float = 0.0,
        longest: int = 2,
        efficiency: float = 0.65,
        urgent: float = 0.5,
        hold: bool = False,
        reserve_targets: bool = False,
        avoid_big: bool = False,
        hold_running: bool = False,
        spare_small: bool = True,
        hold_buddies: bool = False,
        target_order: str = "deadline",
    ):
        super().__init__(ncost, node)
        self.window = window
        self.give_up_power = give_up_power
        self.forecast = ArrivalForecast() if forecast else None
        self.min_gain = min_gain
        self.aging = aging
        self.reserve = reserve
        self.spare = spare
        self.batching = batching
        self.margin = margin
        self.longest = longest
        self.efficiency = efficiency
        self.urgent = urgent
        self.hold = hold
        self.reserve_targets = reserve_targets
        self.avoid_big = avoid_big
        self.hold_running = hold_running
        self.spare_small = spare_small
        self.hold_buddies = hold_buddies
        self.target_order = target_order
        self._static: dict[str, tuple] = {}

    # ---- numbers -----------------------------------------------------------------------
    def _cand(self, item, req: Request, steps_done: int, home: Group | None) -> _Cand:
        static = self._static.get(req.id)
        if static is None:
            base = tuple(
                self.ncost.alone_step(req, d) / self.ncost.correction(req.model)
                for d in self.node.degrees
            )
            cost = self.ncost.cost
            static = (base, cost.decode_time(req), cost.encode_time(req))
            self._static[req.id] = static
        base, dec, enc = static
        corr = self.ncost.correction(req.model)
        tau = tuple(t * corr for t in base) if corr != 1.0 else base
        return _Cand(item, req, req.steps - steps_done, steps_done > 0, home, tau, dec, enc)

    def _capacity(self, delta: float, now: float) -> float:
        cap = self.node.devices * delta
        if self.forecast is not None:
            cap -= self.forecast.work_before(delta, now)
        return cap

    def _need(self, c: _Cand, now: float) -> None:
        budget = (c.req.deadline - now) * (1.0 - self.margin)
        for k, d in enumerate(self.node.degrees):
            rem = c.rem(k)
            if rem <= budget:
                c.need, c.work = d, d * rem
                return
        c.need, c.work, c.late = 0, INF, True

    def _classify(self, now: float, cands: list[_Cand], running: list[_Cand]) -> list[_Cand]:
        """Mark late ones (step 2); return the on-time placeable candidates by deadline."""
        ontime = [c for c in cands + running if not c.late]
        ontime.sort(key=lambda c: (c.req.deadline, c.req.arrival))
        heap: list[tuple[float, int, _Cand]] = []
        work = 0.0
        for n, c in enumerate(ontime):
            work += c.work
            heapq.heappush(heap, (-c.work / c.req.weight**self.give_up_power, n, c))
            while heap and work > self._capacity(c.req.deadline - now, now) + 1e-9:
                victim = heapq.heappop(heap)[2]
                victim.late = True
                work -= victim.work
        return [
            c
            for c in ontime
            if not c.late and not (isinstance(c.item, NodeStatus) and c.item.running)
        ]

    # ---- the decision ------------------------------------------------------------------
    def schedule(self, view: NodeView) -> NodePlan:
        now = view.now
        if self.forecast is not None:
            self.forecast.see(view.waiting.arrived_after(self.forecast.latest))
        cands = [self._cand(s, s.request, s.steps_done, s.group) for s in view.paused]
        cands += [self._cand(r, r, 0, None) for r in view.waiting.iter_by("deadline", self.window)]
        running = [self._cand(s, s.request, s.steps_done + 1, s.group) for s in view.running]
        for c in cands + running:
            self._need(c, now)
        ontime = self._classify(now, cands, running)
        late = sorted((c for c in cands if c.late), key=lambda c: self._late_key(now, c))
        placer = Placer(view, self.ncost)
        placed: list[tuple[Assignment, list[_Cand]]] = []
        starving = [c for c in late if self._starving(now, c)]
        urgent = [c for c in ontime if self._urgent(now, c)]
        targets = self._targets(now, ontime, running) if self.longest > 0 and not starving else []
        done: set[int] = set()
        # Steps 3-4: starving and urgent requests, then the parallel targets at their
        # degree, then the rest by deadline, then late ones.
        left = self._place_all(placer, view, starving + urgent, placed, done)
        big = 0
        for r in running:
            if self._parallel_worthy(r) and r.home is not None:
                big |= r.home.mask
                if self.hold_running and r.home.degree < self._best_degree(r):
                    # Keep the rest of its best group free: it grows at its next step.
                    whole = self.node.group_of(r.home.first, self._best_degree(r))
                    placer.reserved |= whole.mask & placer.available
        reserved = False
        for c, degree in targets:
            if id(c) not in done:
                reserved |= self._place_target(placer, view, c, degree, big, reserved, placed)
                if placed and placed[-1][1][0] is c:
                    done.add(id(c))
        held = {id(c) for c, _ in targets}
        if self.hold:
            held |= self._queued(now, ontime, targets)
        rest = [c for c in ontime + late if id(c) not in done and id(c) not in held]
        left += self._place_all(placer, view, rest, placed, done)
        if self.batching and left:
            self._batch(now, placer, placed, [c for c in left if id(c) not in done])
        if self.spare:
            self._upgrade(placer, placed)
        return placer.plan()

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
            if self.reserve and not c.late and need > 1 and not reserved:
                reserved = self._reserve(placer, view, need)
        return left

    def _place_target(self, placer, view, c: _Cand, degree: int, big: int, reserved, placed):
        """Place target ``c`` at ``degree`` or, failing that, the largest lower degree (>= 2)
        on a group whose ``degree``-group holds no other running parallel request (``big``),
        keeping the rest of that group free so it can grow next step. With none free, hold
        the ``degree``-group that frees soonest (once per decision). Returns whether it
        reserved."""
        tries = [(d, True) for d in reversed(self.node.degrees) if max(2, c.need) <= d < degree]
        tries = [(degree, False)] + tries + [(d, False) for d, _ in tries]
        for d, avoiding in tries:
            avoid = self._overlapping(big, d, degree) if avoiding and self.avoid_big else 0
            if avoiding and not avoid:
                continue
            g = best_group(self.node, placer, d, c.home, avoid)
            a = placer.take(g, [c.item], 1) if g is not None else None
            if a is None:
                continue
            placed.append((a, [c]))
            if d < degree and self.hold_buddies:
                whole = self.node.group_of(a.group.first, degree)
                placer.reserved |= whole.mask & placer.available
            return False
        if self.reserve_targets and not reserved:
            return self._reserve(placer, view, degree, avoid=big)
        return False

    def _overlapping(self, mask: int, degree: int, whole: int) -> int:
        """Devices of every ``whole``-degree group that overlaps ``mask``."""
        out = 0
        for g in self.node.groups(whole):
            if g.mask & mask:
                out |= g.mask
        return out

    def _targets(self, now: float, ontime: list[_Cand], running: list[_Cand]):
        """Step 3a: the ``longest`` on-time requests with the most work left, each with the
        largest degree of parallel efficiency >= ``efficiency`` (speed-up / degree) that
        leaves every other on-time request feasible on the devices left while it runs."""
        degrees = self.node.degrees
        pool = sorted(
            (c for c in ontime if self._parallel_worthy(c)),
            key=lambda c: (c.req.deadline, c.req.arrival) if self.target_order == "deadline"
            else (c.rem(0), c.req.deadline),
        )[: self.longest]
        others = sorted(
            (c for c in ontime + running if not c.late), key=lambda c: c.req.deadline
        )
        chosen: list[tuple[_Cand, int, float]] = []  # (cand, degree, seconds at it)
        for big in pool:
            best = None
            for k in range(len(degrees) - 1, -1, -1):
                d = degrees[k]
                if d <= max(big.need, 1):
                    break
                if big.tau[0] / big.tau[k] / d < self.efficiency:
                    continue
                trial = chosen + [(big, d, big.rem(k))]
                if self._fits(now, trial, others):
                    best = (big, d, big.rem(k))
                    break
            if best is None:
                continue
            chosen.append(best)
        return [(c, d) for c, d, _ in chosen]

    def _queued(self, now: float, ontime: list[_Cand], targets) -> set[int]:
        """Parallel-worthy on-time requests behind the targets that wait for a large group
        (instead of starting at a low degree) while not urgent: the next ``longest``."""
        if not targets:
            return set()
        chosen = {id(c) for c, _ in targets}
        behind = [
            c for c in ontime
            if id(c) not in chosen and self._parallel_worthy(c) and not self._urgent(now, c)
        ]
        return {id(c) for c in behind[: self.longest]}

    def _best_degree(self, c: _Cand) -> int:
        """The largest degree running ``c`` at parallel efficiency >= ``efficiency``."""
        best = 1
        for k, d in enumerate(self.node.degrees):
            if c.tau[0] / c.tau[k] / d >= self.efficiency:
                best = d
        return best

    def _parallel_worthy(self, c: _Cand) -> bool:
        """Whether degree 4 (the node's largest below 4 on smaller nodes) runs ``c`` at
        least at ``efficiency`` (speed-up / degree)."""
        k = min(2, len(c.tau) - 1)
        d = self.node.degrees[k]
        return k > 0 and c.tau[0] / c.tau[k] / d >= self.efficiency

    def _urgent(self, now: float, c: _Cand) -> bool:
        """Whether ``c`` has used up all but ``urgent`` of its SLO window's slack."""
        k = self.node.degrees.index(c.need) if c.need else 0
        slack = c.req.deadline - now - c.rem(k)
        return slack < self.urgent * (c.req.deadline - c.req.arrival)

    def _fits(self, now: float, chosen, others: list[_Cand]) -> bool:
        """Whether ``others`` (by deadline) stay feasible on the node while each chosen
        request holds its degree's devices for its time at that degree."""
        skip = {id(c) for c, _, _ in chosen}
        work = 0.0
        for c in others:
            if id(c) in skip:
                continue
            work += c.work
            delta = c.req.deadline - now
            held = sum(d * min(delta, secs) for _, d, secs in chosen)
            if work > self._capacity(delta, now) - held + 1e-9:
                return False
        return True

    def _place(self, placer: Placer, c: _Cand, need: int) -> Assignment | None:
        for d in self.node.degrees:
            if d < need:
                continue
            g = best_group(self.node, placer, d, c.home)
            if g is not None:
                return placer.take(g, [c.item], 1)
        return None

    def _reserve(self, placer: Placer, view: NodeView, degree: int, avoid: int = 0) -> bool:
        """Hold the group of ``degree`` that frees soonest (its running jobs' latest predicted
        end; groups with devices taken in this decision or in ``avoid`` are skipped)."""
        ends = {}
        for s in view.running:
            if s.group is not None:
                for dev in s.group.devices:
                    ends[dev] = max(ends.get(dev, 0.0), s.job_end)
        skip = placer.reserved | (view.free & ~placer.free) | avoid
        best, key = None, None
        for g in self.node.groups(degree):
            if g.mask & skip:
                continue
            k = max((ends.get(d, view.now) for d in g.devices), default=view.now)
            if key is None or k < key:
                best, key = g, k
        if best is None:
            return False
        placer.reserved |= best.mask
        return True

    def _batch(self, now: float, placer: Placer, placed, left: list[_Cand]) -> None:
        """Step 4: join requests left without a device to degree-1 steps of their model."""
        cost = self.ncost
        for c in left:
            if c.req.id in placer.taken:
                continue
            for a, members in placed:
                head = members[0]
                if a.group.degree != 1 or head.req.model != c.req.model:
                    continue
                if len(members) >= cost.cost.max_batch(c.req.model):
                    continue
                tokens = [cost.cost.tokens(m.req) for m in members]
                old = cost.step_time(c.req.model, tokens, 1)
                grown = cost.step_time(c.req.model, tokens + [cost.cost.tokens(c.req)], 1) - old
                if grown > (1.0 - self.min_gain) * c.tau[0]:
                    continue
                if any(
                    not m.late and now + m.rem(0) + grown * m.steps_left > m.req.deadline
                    for m in members + [c]
                ):
                    continue
                if self._join(placer, a, c):
                    members.append(c)
                    a.batch.append(c.req.id)
                    break

    def _join(self, placer: Placer, a: Assignment, c: _Cand) -> bool:
        """Add ``c`` to the assignment ``a`` (pages on its group, started cap)."""
        if isinstance(c.item, Request):
            if placer.view.max_started is not None:
                if placer.started + 1 > placer.view.max_started:
                    return False
            placer.started += 1
        if c.home != a.group:
            need = self.ncost.shard_pages(c.req, 1, placer.view.page_bytes)
            dev = a.group.first
            if placer.pages[dev] < need:
                return False
            placer.pages[dev] -= need
        placer.taken.add(c.req.id)
        return True

    def _upgrade(self, placer: Placer, placed) -> None:
        """Step 5: double the group of the longest single-request assignment while its
        buddy devices are free (and hold the pages its new shards need)."""
        singles = [(a, m[0]) for a, m in placed if len(m) == 1]
        page_bytes = placer.view.page_bytes
        while placer.available and singles:
            best = None
            for a, c in singles:
                parent = self.node.parent(a.group)
                if parent is None or (parent.mask & ~a.group.mask) & ~placer.available:
                    continue
                if not self.spare_small and not self._parallel_worthy(c):
                    if parent.degree > self._best_degree(c):
                        continue
                pages = self.ncost.shard_pages(c.req, parent.degree, page_bytes)
                if any(placer.pages[d] < pages for d in parent.devices if d not in a.group.devices):
                    continue
                rem = c.rem(self.node.degrees.index(a.group.degree))
                if best is None or rem > best[0]:
                    best = (rem, a, parent, pages)
            if best is None:
                return
            _, a, parent, pages = best
            for d in parent.devices:
                if d not in a.group.devices:
                    placer.pages[d] -= pages
            placer.free &= ~parent.mask
            a.group = parent

    def _late_key(self, now: float, c: _Cand) -> tuple:
        lost = now + c.rem(len(self.node.degrees) - 1) > c.req.deadline
        return (lost, c.rem(0) / c.req.weight, c.req.arrival)

    def _starving(self, now: float, c: _Cand) -> bool:
        window = c.req.deadline - c.req.arrival
        return now - c.req.deadline > self.aging * window

    def observe(self, report) -> None:
        super().observe(report)
        for rid in report.finished:
            self._static.pop(rid, None)
