"""Which replica takes a request: the ditmem rule and the two baselines people use today.

Pure Python: the Ray Serve router (:mod:`ditmem.deploy.router`) and the cluster simulator
call the same functions. Times are seconds on one clock (the router's); work is seconds of
device time by the cost model (a replica running alone); memory is pages.

A replica reports a :class:`ReplicaLoad` now and then (Ray: ``record_routing_stats``, every
``request_routing_stats_period_s``): its backlog by priority and earliest slack per
priority (for people: ``/metrics``), free pages, its measured speed, and its work *by
deadline* (``due``: each live request's deadline and remaining seconds, earliest first),
which is what the rule reads, because the ``slo`` step policy runs on-time requests
earliest deadline first. Between two reports the router keeps what it has sent each
replica (:class:`RoutingBook`), and :func:`estimate` ages the last report: the replica has
worked ``now - reported_at`` seconds since, earliest deadline first, and has also received
everything routed to it after the report.

The ditmem rule (:func:`rank_replicas`) places a request of ``w`` seconds of work
(``w * speed`` on a replica whose cost model measured it ``speed`` times slower than the
profile) on replica ``r`` as that policy would run it: behind the work due before its
deadline, ahead of the work due after. It ranks the replicas in four tiers:

0. the request meets its deadline there with at least half its time to spare, and no
   request due after it that still meets its own deadline is pushed past it;
1. the same with less to spare;
2. the request meets its deadline, but pushes others past theirs;
3. the request misses its deadline there.

Within tier 0 the replica with the least work already there wins: where a request is
comfortably on time anywhere, the cluster's load is kept even, and an idle replica gets
the request whatever speed it last measured (a replica that measured itself slow once and
then got no work would otherwise never measure again); within tier 1 the replica where
the request finishes first; within tier 2 the one with the least lateness inflicted on
others (weighted by their priority, 3:2:1);
within tier 3 again the least total work: a request that misses everywhere joins its
replica's late lane (the ``slo`` policy runs late requests after on-time work), so it
finishes about when that replica's whole backlog has run. Ties go to the replica with
less total work, then more free pages, then the lower index.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

PRIORITIES = (0, 1, 2)
#: Harm weight of each priority class (as ``PRIORITY_WEIGHTS`` of the scheduler).
WEIGHTS = {0: 3.0, 1: 2.0, 2: 1.0}
#: Most ``due`` entries a report carries; later ones merge into one (module docstring).
MAX_DUE = 64


@dataclass(slots=True)
class ReplicaLoad:
    """One replica's report at ``reported_at``.

    ``backlog_s[p]``: seconds of work left in its priority-``p`` requests (queued and
    started); ``slack_s[p]``: the least slack among its priority-``p`` requests (deadline
    minus the time the request would finish if the replica ran its backlog earliest
    deadline first, seconds; None when it has none of that priority); ``free_pages`` /
    ``total_pages``: its device page pool; ``ongoing``: requests it holds (queued +
    started); ``speed``: its measured / predicted time factor (the cost model's
    correction): a request priced at ``w`` seconds adds ``w * speed`` to its backlog;
    ``devices``: devices it runs requests on (a node reports backlog in device-seconds /
    devices, and ``speed`` includes the 1 / devices). A request alone takes at least what
    it takes on one of its devices, ``w * speed * devices``: the rule never assumes a
    request gets the whole node. ``due``: ``(deadline, remaining_s, priority)`` of each
    live request, earliest deadline first, at most :data:`MAX_DUE` (the rest merged into
    one entry at the earliest of their deadlines, holding all their work: never less
    urgent than they are)."""

    replica: str
    backlog_s: tuple[float, float, float]
    slack_s: tuple[float | None, float | None, float | None]
    free_pages: int
    total_pages: int
    ongoing: int
    reported_at: float
    speed: float = 1.0
    devices: int = 1
    due: tuple[tuple[float, float, int], ...] = ()
    live: frozenset[str] = frozenset()

    @property
    def earliest_slack_s(self) -> float | None:
        values = [s for s in self.slack_s if s is not None]
        return min(values) if values else None

    def as_dict(self) -> dict:
        """Plain types only (what ``record_routing_stats`` returns)."""
        return {"replica": self.replica, "backlog_s": list(self.backlog_s),
                "slack_s": list(self.slack_s), "free_pages": self.free_pages,
                "total_pages": self.total_pages, "ongoing": self.ongoing,
                "reported_at": self.reported_at, "speed": self.speed,
                "devices": self.devices, "due": [list(d) for d in self.due],
                "live": sorted(self.live)}

    @classmethod
    def from_dict(cls, data: dict) -> ReplicaLoad:
        """Inverse of :meth:`as_dict`; ValueError naming a missing or malformed field."""
        try:
            backlog = tuple(float(x) for x in data["backlog_s"])
            slack = tuple(None if x is None else float(x) for x in data["slack_s"])
            load = cls(replica=str(data["replica"]), backlog_s=backlog, slack_s=slack,
                       free_pages=int(data["free_pages"]),
                       total_pages=int(data["total_pages"]), ongoing=int(data["ongoing"]),
                       reported_at=float(data["reported_at"]),
                       speed=float(data.get("speed", 1.0)),
                       devices=int(data.get("devices", 1)),
                       due=tuple((float(d), float(w), int(p))
                                 for d, w, p in data.get("due", ())),
                       live=frozenset(str(i) for i in data.get("live", ())))
        except KeyError as exc:
            raise ValueError(f"routing stats: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"routing stats: malformed ({exc})") from None
        if load.devices < 1:
            raise ValueError(f"routing stats: devices must be >= 1, got {load.devices}")
        if not load.speed > 0:
            raise ValueError(f"routing stats: speed must be > 0, got {load.speed}")
        if len(load.backlog_s) != 3 or len(load.slack_s) != 3:
            raise ValueError("routing stats: backlog_s and slack_s need one entry per "
                             "priority 0, 1, 2")
        return load


@dataclass(slots=True)
class RouteRequest:
    """What the router knows of a pending request: ``work_s`` seconds alone on a replica
    (the cost model's standalone estimate), ``pages`` of state, ``priority`` 0/1/2 and its
    absolute ``deadline`` (same clock as ``now``)."""

    id: str
    work_s: float
    pages: int
    priority: int
    deadline: float

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ValueError(f"priority: 0, 1 or 2, got {self.priority!r}")
        if not self.work_s >= 0:
            raise ValueError(f"work_s: must be >= 0, got {self.work_s!r}")
        if self.pages < 0:
            raise ValueError(f"pages: must be >= 0, got {self.pages!r}")


@dataclass(slots=True)
class Sent:
    """A request routed to a replica at ``sent_at``."""

    request: RouteRequest
    sent_at: float


@dataclass(slots=True)
class RoutingBook:
    """Requests routed to each replica and not yet covered by one of its reports.

    ``transit_s``: how long a routed request may take to reach its replica's engine. A
    report made within that time after a request was sent covers it only if it lists the
    request among its ``live`` ids; otherwise the request was still on its way when the
    replica reported (it would vanish from both the report and the book, and the replica
    would look idle). 0 (the simulator, whose replicas receive a request the instant it
    is routed): every report covers what was sent before it."""

    sent: dict[str, list[Sent]] = field(default_factory=dict)
    transit_s: float = 0.0

    def record(self, replica: str, request: RouteRequest, now: float) -> None:
        self.sent.setdefault(replica, []).append(Sent(request, now))

    def since(self, replica: str, reported_at: float,
              live: frozenset[str] = frozenset()) -> list[Sent]:
        """What was sent to ``replica`` and is not in its report of ``reported_at``
        (sent at or after it, or in transit then: see the class docstring); entries the
        report covers are dropped."""
        entries = [s for s in self.sent.get(replica, ())
                   if s.sent_at >= reported_at
                   or (s.sent_at >= reported_at - self.transit_s and s.request.id not in live)]
        if entries:
            self.sent[replica] = entries
        else:
            self.sent.pop(replica, None)
        return entries

    def forget(self, replica: str) -> None:
        self.sent.pop(replica, None)


@dataclass(slots=True)
class Estimate:
    """A replica's load now: the report aged by the time since and plus what was sent.
    ``due``: ``[deadline, remaining_s, priority]`` earliest deadline first."""

    replica: str
    due: list[list]
    free_pages: int
    ongoing: int
    speed: float = 1.0
    devices: int = 1

    @property
    def total_s(self) -> float:
        return sum(item[1] for item in self.due)


def estimate(load: ReplicaLoad, sent: Sequence[Sent], now: float) -> Estimate:
    """``load`` as of ``now``: the requests in ``sent`` (routed after the report) join it,
    and the replica's work since the report comes off it, earliest deadline first."""
    due = [list(item) for item in load.due]
    free, ongoing = load.free_pages, load.ongoing
    clock = load.reported_at
    for entry in sorted(sent, key=lambda s: s.sent_at):
        _work(due, entry.sent_at - clock)
        clock = max(clock, entry.sent_at)
        req = entry.request
        bisect.insort(due, [req.deadline, req.work_s * load.speed, req.priority])
        free -= req.pages
        ongoing += 1
    _work(due, now - clock)
    return Estimate(load.replica, due, free, ongoing, load.speed, load.devices)


def _work(due: list[list], seconds: float) -> None:
    """The replica ran ``seconds``: its work shrinks, earliest deadline first."""
    seconds = max(0.0, seconds)
    while due and seconds > 0:
        done = min(due[0][1], seconds)
        due[0][1] -= done
        seconds -= done
        if due[0][1] <= 0:
            due.pop(0)


@dataclass(slots=True)
class Score:
    """Why a replica ranks where it does (lower sorts first)."""

    replica: str
    tier: int
    key: float
    finish: float
    total_s: float
    free_pages: int


def score(req: RouteRequest, est: Estimate, now: float) -> Score:
    """Tier and in-tier key of placing ``req`` on the replica ``est`` describes."""
    work = req.work_s * est.speed
    alone = work * est.devices
    ahead = sum(w for d, w, _ in est.due if d <= req.deadline)
    total = est.total_s + work
    finish = now + ahead + alone
    # A request that needs more pages than are free waits for some to come free: at worst
    # until the replica's whole backlog ran.
    if est.free_pages < req.pages:
        finish = max(finish, now + est.total_s + alone)
    if finish > req.deadline:
        return Score(est.replica, 3, total, finish, total, est.free_pages)
    inflicted, clock = 0.0, now + ahead
    for deadline, w, priority in est.due:
        if deadline <= req.deadline:
            continue
        clock += w
        if clock <= deadline < clock + work:  # on time before, late after
            inflicted += WEIGHTS.get(priority, 1.0) * (clock + work - deadline)
    if inflicted > 0:
        return Score(est.replica, 2, inflicted, finish, total, est.free_pages)
    if req.deadline - finish >= 0.5 * (req.deadline - now):
        # the work already there, not counting the request's own price: an idle replica
        # always wins here, whatever speed it last measured
        return Score(est.replica, 0, est.total_s, finish, total, est.free_pages)
    return Score(est.replica, 1, finish, finish, total, est.free_pages)


def rank_replicas(req: RouteRequest, loads: Sequence[ReplicaLoad], book: RoutingBook,
                  now: float) -> list[Score]:
    """The replicas ``loads`` names, best first, by the ditmem rule (module docstring)."""
    scores = [score(req, estimate(load, book.since(load.replica, load.reported_at, load.live),
                                  now), now)
              for load in loads]
    order = sorted(range(len(scores)),
                   key=lambda i: (scores[i].tier, scores[i].key, scores[i].total_s,
                                  -scores[i].free_pages, i))
    return [scores[i] for i in order]


def choose_ditmem(req: RouteRequest, loads: Sequence[ReplicaLoad], book: RoutingBook,
                  now: float) -> str:
    """The best replica by :func:`rank_replicas`; records the choice in ``book``."""
    if not loads:
        raise ValueError("loads: no replica to route to")
    best = rank_replicas(req, loads, book, now)[0].replica
    book.record(best, req, now)
    return best


def plan_moves(here: ReplicaLoad, parked: Sequence[RouteRequest],
               others: Sequence[ReplicaLoad], book: RoutingBook, now: float, *,
               move_s: float = 0.0, limit: int = 1) -> list[tuple[str, str]]:
    """Which parked requests of replica ``here`` (its report, fresh) should move, and to
    which of ``others``: ``[(request id, replica)]``, at most ``limit``.

    ``parked``: requests ``here`` could hand off now (``work_s``: their remaining work at
    the profile's price, ``deadline``). A request moves when it misses its deadline here
    (``here`` runs on-time work earliest deadline first: it finishes after everything due
    no later than it, its own rest included) and another replica places it in tier 0 or 1
    of :func:`rank_replicas` with ``move_s`` (the hand-off's own time) taken off its
    deadline: on time there, no one else pushed late. Earliest deadline first; each move
    is recorded in ``book``, so the next one sees it."""
    moves: list[tuple[str, str]] = []
    if not others or limit < 1:
        return moves
    for req in sorted(parked, key=lambda r: (r.deadline, r.id)):
        finish = now + sum(w for d, w, _ in here.due if d <= req.deadline)
        if finish <= req.deadline:
            continue
        moved = RouteRequest(req.id, req.work_s, req.pages, req.priority,
                             req.deadline - move_s)
        best = rank_replicas(moved, others, book, now)[0]
        if best.tier <= 1:
            book.record(best.replica, moved, now)
            moves.append((req.id, best.replica))
            if len(moves) >= limit:
                break
    return moves


class RoundRobin:
    """Replicas in turn, whatever their load (vllm-omni ``num_replicas``, SGLang
    ``--dp-size``)."""

    uses_reports = False

    def __init__(self) -> None:
        self.next = 0

    def choose(self, req: RouteRequest, loads: Sequence[ReplicaLoad], book: RoutingBook,
               now: float) -> str:
        if not loads:
            raise ValueError("loads: no replica to route to")
        pick = loads[self.next % len(loads)].replica
        self.next += 1
        book.record(pick, req, now)
        return pick


class PowerOfTwo:
    """Two replicas drawn at random; the one holding fewer requests wins (Ray Serve's
    default): it counts requests, not their size or deadline."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def choose(self, req: RouteRequest, loads: Sequence[ReplicaLoad], book: RoutingBook,
               now: float) -> str:
        if not loads:
            raise ValueError("loads: no replica to route to")
        picks = self.rng.sample(range(len(loads)), min(2, len(loads)))
        ongoing = [estimate(loads[i], book.since(loads[i].replica, loads[i].reported_at,
                                                 loads[i].live),
                            now).ongoing for i in picks]
        pick = loads[picks[ongoing.index(min(ongoing))]].replica
        book.record(pick, req, now)
        return pick


class DitmemRouter:
    """:func:`choose_ditmem` as an object with the baselines' ``choose`` signature."""

    def choose(self, req: RouteRequest, loads: Sequence[ReplicaLoad], book: RoutingBook,
               now: float) -> str:
        return choose_ditmem(req, loads, book, now)


ROUTERS = ("ditmem", "round-robin", "pow2")


def make_router(name: str, seed: int = 0):
    """``"ditmem"`` | ``"round-robin"`` | ``"pow2"`` -> an object with ``choose``."""
    if name == "ditmem":
        return DitmemRouter()
    if name == "round-robin":
        return RoundRobin()
    if name == "pow2":
        return PowerOfTwo(seed)
    raise ValueError(f"router: one of {', '.join(ROUTERS)}, got {name!r}")


def load_of(replica: str, items: Sequence[tuple[int, float, float]], free_pages: int,
            total_pages: int, now: float, speed: float = 1.0,
            devices: int = 1, ids: Sequence[str] = ()) -> ReplicaLoad:
    """A replica's report from its live requests, each ``(priority, deadline,
    remaining_s)``: backlog by priority; each class's least slack when the backlog runs
    earliest deadline first (deadline minus that finish); ``due`` (module docstring);
    ``ids``: the live requests' ids (what :class:`RoutingBook` checks in-transit entries
    against)."""
    backlog = [0.0, 0.0, 0.0]
    slack: list[float | None] = [None, None, None]
    for priority, _, _ in items:
        if priority not in PRIORITIES:
            raise ValueError(f"items: priority 0, 1 or 2, got {priority!r}")
    ordered = sorted(items, key=lambda it: (it[1], it[0]))
    clock = now
    for priority, deadline, remaining in ordered:
        backlog[priority] += remaining
        clock += remaining
        s = deadline - clock
        current = slack[priority]
        slack[priority] = s if current is None else min(current, s)
    due = [(deadline, remaining, priority) for priority, deadline, remaining in ordered]
    if len(due) > MAX_DUE:
        rest = due[MAX_DUE - 1:]
        due = due[: MAX_DUE - 1] + [(rest[0][0], sum(w for _, w, _ in rest),
                                     min(p for _, _, p in rest))]
    return ReplicaLoad(replica, (backlog[0], backlog[1], backlog[2]),
                       (slack[0], slack[1], slack[2]), free_pages, total_pages, len(items),
                       now, speed, devices, tuple(due), frozenset(ids))
