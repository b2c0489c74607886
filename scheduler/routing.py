"""Which replica takes a request: the ditmem rule and the two baselines people use today.

Pure Python: the Ray Serve router (:mod:`ditmem.deploy.router`) and the cluster simulator
call the same functions. Times are seconds on one clock (the router's); work is seconds of
device time by the cost model (a replica running alone); memory is pages.

A replica reports a :class:`ReplicaLoad` now and then (Ray: ``record_routing_stats``, every
``request_routing_stats_period_s``). Between two reports the router keeps what it has sent
each replica (:class:`RoutingBook`), and :func:`estimate` ages the last report: the replica
has worked ``now - reported_at`` seconds since, highest priority first, and has also
received everything routed to it after the report.

The ditmem rule (:func:`rank_replicas`) places a request of priority ``p`` and ``w``
seconds of work (``w * speed`` on a replica whose cost model measured it ``speed`` times
slower than the profile) on replica ``r`` as the replica's step policy would run it: behind
the work of priorities ``<= p``, ahead of lower priorities. It ranks the replicas in three
tiers:

0. the request meets its deadline there and no lower-priority class whose earliest
   request still meets its own deadline is pushed past it (its slack stays >= 0);
1. the request meets its deadline, but pushes some other request past its own;
2. the request misses its deadline there.

Within tier 0 the replica with the least total work after placement wins (the request
delays the least work behind it and the cluster's load stays even); within tier 1 the one
with the least lateness inflicted on others; within tier 2 again the least total work: a
request that misses everywhere joins its replica's late lane (the ``slo`` policy runs late
requests after on-time work), so it finishes about when that replica's whole backlog has
run. Ties go to the replica with more free pages, then to the lower index.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

PRIORITIES = (0, 1, 2)


@dataclass(slots=True)
class ReplicaLoad:
    """One replica's report at ``reported_at``.

    ``backlog_s[p]``: seconds of work left in its priority-``p`` requests (queued and
    started); ``slack_s[p]``: the least slack among its priority-``p`` requests (deadline
    minus the time the request would finish if the replica ran its backlog in priority
    order, seconds; None when it has none of that priority); ``free_pages`` / ``total_pages``:
    its device page pool; ``ongoing``: requests it holds (queued + started); ``speed``: its
    measured / predicted time factor (the cost model's correction): a request priced at
    ``w`` seconds adds ``w * speed`` to its backlog; ``devices``: devices it runs requests
    on (a node reports backlog in device-seconds / devices, and ``speed`` includes the
    1 / devices). A request alone takes at least what it takes on one of its devices,
    ``w * speed * devices``: the rule never assumes a request gets the whole node."""

    replica: str
    backlog_s: tuple[float, float, float]
    slack_s: tuple[float | None, float | None, float | None]
    free_pages: int
    total_pages: int
    ongoing: int
    reported_at: float
    speed: float = 1.0
    devices: int = 1

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
                "devices": self.devices}

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
                       devices=int(data.get("devices", 1)))
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
    """Requests routed to each replica and not yet covered by one of its reports."""

    sent: dict[str, list[Sent]] = field(default_factory=dict)

    def record(self, replica: str, request: RouteRequest, now: float) -> None:
        self.sent.setdefault(replica, []).append(Sent(request, now))

    def since(self, replica: str, reported_at: float) -> list[Sent]:
        """What was sent to ``replica`` at or after ``reported_at``; older entries are
        dropped (the report counts them)."""
        entries = [s for s in self.sent.get(replica, ()) if s.sent_at >= reported_at]
        if entries:
            self.sent[replica] = entries
        else:
            self.sent.pop(replica, None)
        return entries

    def forget(self, replica: str) -> None:
        self.sent.pop(replica, None)


@dataclass(slots=True)
class Estimate:
    """A replica's load now: the report aged by the time since and plus what was sent."""

    replica: str
    backlog_s: list[float]
    slack_s: list[float | None]
    free_pages: int
    ongoing: int
    speed: float = 1.0
    devices: int = 1

    @property
    def total_s(self) -> float:
        return sum(self.backlog_s)


def estimate(load: ReplicaLoad, sent: Sequence[Sent], now: float) -> Estimate:
    """``load`` as of ``now``: the requests in ``sent`` (routed after the report) join it
    in priority order, and the ``now - reported_at`` seconds the replica has worked since
    come off its backlog, highest priority first."""
    backlog = list(load.backlog_s)
    slack = list(load.slack_s)
    free, ongoing = load.free_pages, load.ongoing
    clock = load.reported_at
    for entry in sorted(sent, key=lambda s: s.sent_at):
        _work(backlog, entry.sent_at - clock)
        clock = max(clock, entry.sent_at)
        _place(backlog, slack, entry.request, entry.sent_at, load.speed, load.devices)
        free -= entry.request.pages
        ongoing += 1
    _work(backlog, now - clock)
    return Estimate(load.replica, backlog, slack, free, ongoing, load.speed, load.devices)


def _work(backlog: list[float], seconds: float) -> None:
    """The replica ran ``seconds``: its backlog shrinks, highest priority first."""
    seconds = max(0.0, seconds)
    for p in PRIORITIES:
        done = min(backlog[p], seconds)
        backlog[p] -= done
        seconds -= done


def _place(backlog: list[float], slack: list[float | None], req: RouteRequest,
           at: float, speed: float, devices: int) -> None:
    """Add ``req`` to a replica's backlog: lower priorities now wait its work longer."""
    work = req.work_s * speed
    own = req.deadline - at - sum(backlog[: req.priority + 1]) - work * devices
    backlog[req.priority] += work
    current = slack[req.priority]
    slack[req.priority] = own if current is None else min(current, own)
    for q in range(req.priority + 1, len(PRIORITIES)):
        if slack[q] is not None:
            slack[q] -= work


@dataclass(slots=True)
class Score:
    """Why a replica ranks where it does (lower sorts first)."""

    replica: str
    tier: int
    key: float
    finish: float
    free_pages: int


def score(req: RouteRequest, est: Estimate, now: float) -> Score:
    """Tier and in-tier key of placing ``req`` on the replica ``est`` describes."""
    work = req.work_s * est.speed
    alone = work * est.devices
    ahead = sum(est.backlog_s[: req.priority + 1])
    finish = now + ahead + alone
    # A request that needs more pages than are free waits for some to come free: at worst
    # until the replica's whole backlog ran.
    if est.free_pages < req.pages:
        finish = max(finish, now + est.total_s + alone)
    if finish > req.deadline:
        return Score(est.replica, 2, est.total_s + work, finish, est.free_pages)
    inflicted = 0.0
    for q in range(req.priority + 1, len(PRIORITIES)):
        s = est.slack_s[q]
        if s is not None and s >= 0 and s - work < 0:
            inflicted += work - s
    if inflicted > 0:
        return Score(est.replica, 1, inflicted, finish, est.free_pages)
    return Score(est.replica, 0, est.total_s + work, finish, est.free_pages)


def rank_replicas(req: RouteRequest, loads: Sequence[ReplicaLoad], book: RoutingBook,
                  now: float) -> list[Score]:
    """The replicas ``loads`` names, best first, by the ditmem rule (module docstring)."""
    scores = [score(req, estimate(load, book.since(load.replica, load.reported_at), now), now)
              for load in loads]
    order = sorted(range(len(scores)),
                   key=lambda i: (scores[i].tier, scores[i].key, -scores[i].free_pages, i))
    return [scores[i] for i in order]


def choose_ditmem(req: RouteRequest, loads: Sequence[ReplicaLoad], book: RoutingBook,
                  now: float) -> str:
    """The best replica by :func:`rank_replicas`; records the choice in ``book``."""
    if not loads:
        raise ValueError("loads: no replica to route to")
    best = rank_replicas(req, loads, book, now)[0].replica
    book.record(best, req, now)
    return best


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
        ongoing = [estimate(loads[i], book.since(loads[i].replica, loads[i].reported_at),
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
            devices: int = 1) -> ReplicaLoad:
    """A replica's report from its live requests, each ``(priority, deadline,
    remaining_s)``: backlog by priority, and each class's least slack when the backlog runs
    in priority order, earliest deadline first within a class."""
    backlog = [0.0, 0.0, 0.0]
    slack: list[float | None] = [None, None, None]
    clock = now
    for priority, deadline, remaining in sorted(items, key=lambda it: (it[0], it[1])):
        if priority not in PRIORITIES:
            raise ValueError(f"items: priority 0, 1 or 2, got {priority!r}")
        backlog[priority] += remaining
        clock += remaining
        s = deadline - clock
        current = slack[priority]
        slack[priority] = s if current is None else min(current, s)
    return ReplicaLoad(replica, (backlog[0], backlog[1], backlog[2]),
                       (slack[0], slack[1], slack[2]), free_pages, total_pages, len(items),
                       now, speed, devices)
