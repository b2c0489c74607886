"""What every node policy offers, and the placement helper they share."""

from __future__ import annotations

from ..cost import MOVE_KINDS, NodeCost
from ..plan import Assignment, NodePlan, NodeStatus, NodeView
from ..topology import Group, Node


class NodePolicy:
    """Base class: ``schedule(view) -> NodePlan`` whenever devices are idle and something
    changed; ``observe(report)`` after every job (feeds the step-time correction);
    ``forget(request_id)`` when the loop drops a cancelled request (never finished, so no
    report names it)."""

    name = "base"
    #: whether the loop spreads a job's decodes over its spare devices (``Job.split_decodes``)
    split_decodes = False
    #: whether the loop may take a split decode's spare devices back between tiles
    #: (``take_back``), and how many waiting requests (by deadline) that rule looks at
    split_yield = False
    yield_window = 16
    #: steps each job this policy launches holds (None: a request's whole rest in one job):
    #: how many times a remaining time pays the links' ``job_latency_s``
    #: (``NodeCost.remaining``'s ``steps_per_job``)
    steps_per_job: int | None = 1

    def __init__(self, ncost: NodeCost, node: Node):
        self.ncost = ncost
        self.node = node

    def schedule(self, view: NodeView) -> NodePlan:
        raise NotImplementedError

    def split_decode(self, view: NodeView, plan: NodePlan, assignment) -> bool:
        """Whether the loop spreads ``assignment``'s decodes (of the members whose last step
        it runs) over its group's spare devices (``Job.split_decodes``); ``plan``: the
        decision it is part of, made on ``view``. Here: ``split_decodes``."""
        return self.split_decodes

    def take_back(self, view: NodeView) -> list[int]:
        """Spare devices of split decodes (``view.spares``) the loop takes back now, between
        two of their tiles (``NodeDevices.reclaim``; the rest of their tiles run on the
        decode's lane). With ``split_yield``: a spare goes to a waiting or paused request
        that would miss its deadline started on the first device free as things are, and
        meets it started on the spare once its tile ends (both alone at degree 1, the policy's
        model), unless the decode it leaves would then miss a deadline it meets now;
        the most urgent such request first, one request per spare. Else none."""
        if not self.split_yield or not view.spares:
            return []
        now, ncost = view.now, self.ncost
        free_now = view.free != 0
        first_free = now if free_now else min(
            (max(now, b) for b in view.busy_until), default=now)
        candidates = [(s.request, s.steps_done) for s in view.paused]
        candidates += [(r, 0) for r in view.waiting.iter_by("deadline", self.yield_window)]
        candidates.sort(key=lambda c: c[0].deadline)
        out: list[int] = []
        spares = sorted(view.spares, key=lambda sp: sp.taken_free_at)
        for req, done in candidates:
            if not spares:
                break
            need = ncost.remaining(req, done, 1, self.steps_per_job)
            if first_free + need <= req.deadline:
                continue  # it makes it without a spare
            for sp in spares:
                if sp.taken_free_at >= sp.free_at - 1e-9:
                    continue  # in its last tile: taking it back frees it no sooner
                if sp.taken_free_at + need > req.deadline:
                    continue
                holder = sp.request.deadline
                if sp.taken_decode_end > holder >= sp.decode_end:
                    continue  # the decode it leaves would miss
                out.append(sp.device)
                spares.remove(sp)
                break
        return out

    def forget(self, request_id: str) -> None:
        """Drop what the policy keeps about a request that will never finish."""

    def observe(self, report) -> None:
        self.ncost.observe_step(
            report.model, report.tokens, report.group.degree, report.steps, report.step_s
        )
        for kind, predicted, measured in report.moves:
            if kind in MOVE_KINDS:
                self.ncost.observe_move(kind, predicted, measured)
        for request, devices, measured in getattr(report, "decodes", ()):
            self.ncost.observe_decode(request, devices, measured)
        if report.encode_s > 0:
            self.ncost.observe_encode(getattr(report, "encoded", ()), report.group.degree,
                                      report.encode_s)


class Placer:
    """One decision's free devices, pages and started count, consumed as groups are taken.

    ``take(group, members, steps)`` returns the Assignment (parking paused requests resident
    on the group, latest deadline first, when its devices lack pages) or None when the group
    is not free, the pages cannot be found or an admit would pass the started cap.
    ``busy``: the devices still running a job (or sending a move) now; a paused request
    resident on one of them cannot be parked or moved elsewhere before that ends
    (``stuck``).
    """

    def __init__(self, view: NodeView, ncost: NodeCost):
        self.view = view
        self.ncost = ncost
        self.free = view.free
        self.reserved = 0
        self.pages = list(view.free_pages)
        self.host_free = view.host_free_pages
        self.started = view.started
        self.taken: set[str] = set()
        self.assignments: list[Assignment] = []
        self._paused: dict[str, NodeStatus] | None = None
        self.busy = 0
        for d, until in enumerate(view.busy_until):
            if until > view.now + 1e-9:
                self.busy |= 1 << d

    def stuck(self, item) -> int:
        """The devices of ``item``'s resident state (a paused NodeStatus) still busy now: a
        move to a group not holding them all would wait for them (0: none)."""
        group = getattr(item, "group", None)
        return 0 if group is None else group.mask & self.busy

    @property
    def available(self) -> int:
        """Free devices not reserved."""
        return self.free & ~self.reserved

    def is_free(self, group: Group) -> bool:
        return group.mask & self.available == group.mask

    def take(self, group: Group, members: list, steps: int = 1) -> Assignment | None:
        if not self.is_free(group) or not members:
            return None
        admits = sum(not isinstance(m, NodeStatus) for m in members)
        if admits and self.view.max_started is not None:
            if self.started + admits > self.view.max_started:
                return None
        need = 0
        for m in members:
            status = m if isinstance(m, NodeStatus) else None
            if status is None or status.group != group:
                req = m.request if status is not None else m
                need += self.ncost.shard_pages(req, group.degree, self.view.page_bytes)
        offload = self._room(group, need, {m.id for m in members})
        if offload is None:
            return None
        a = Assignment(group, [m.id for m in members], steps, offload)
        self.free &= ~group.mask
        for dev in group.devices:
            self.pages[dev] -= need
        self.started += admits
        self.taken.update(a.batch)
        self.assignments.append(a)
        return a

    def _room(self, group: Group, need: int, keep: set[str]) -> list[str] | None:
        short = max(need - self.pages[d] for d in group.devices)
        if short <= 0:
            return []
        victims = sorted(
            (
                s
                for s in self.view.paused
                if s.group is not None and s.group.mask & group.mask and s.id not in keep
                and s.id not in self.taken and not s.group.mask & ~group.mask & self.busy
            ),
            key=lambda s: -(s.request.deadline or 0.0),
        )
        out = []
        for s in victims:
            total = s.pages * s.group.degree
            if total > self.host_free:
                continue
            out.append(s.id)
            self.host_free -= total
            self.taken.add(s.id)
            for dev in s.group.devices:
                self.pages[dev] += s.pages
            if max(need - self.pages[d] for d in group.devices) <= 0:
                return out
        return None

    def plan(self, park_displaced: bool = False) -> NodePlan:
        """The assignments, those moving state off devices outside their group first: a
        device this decision gives a new job sends its paused requests' state before that
        job starts, not after its step. With ``park_displaced``, first ``park_displaced``."""
        if park_displaced:
            self.park_displaced()
        return NodePlan(sorted(self.assignments, key=lambda a: not self._reads_outside(a)))

    def park_displaced(self) -> None:
        """Park on the host the paused requests (not in this plan) resident on the devices
        of an assignment, while those devices are free: a later move of such a request
        would wait for the new job's step on them, a restore from the host waits for
        nothing. Only where the park and the restore cost less than that job's step, the
        host pool has room, no device outside the group still runs a job, and the node has
        devices outside the group (else it could resume nowhere sooner)."""
        cost = self.ncost
        everything = self.view.node.all_mask
        for a in self.assignments:
            if not a.batch or a.group.mask == everything:
                continue
            step = self._step_s(a)
            for s in self.view.paused:
                g = s.group
                if g is None or s.id in self.taken or not g.mask & a.group.mask:
                    continue
                if g.mask & ~a.group.mask & self.busy:
                    continue
                total = s.pages * g.degree
                if total > self.host_free:
                    continue
                if cost.offload_time(s.request, g) + cost.restore_time(s.request, g) > step:
                    continue
                a.offload.append(s.id)
                self.taken.add(s.id)
                self.host_free -= total

    def _step_s(self, a: Assignment) -> float:
        """Predicted seconds of one step of ``a``'s batch on its group."""
        paused, waiting = self._paused_by_id(), self.view.waiting
        reqs = [paused[rid].request if rid in paused else
                (waiting.get(rid) if rid in waiting else None) for rid in a.batch]
        reqs = [r for r in reqs if r is not None]
        if not reqs:
            return 0.0
        tokens = [self.ncost.cost.tokens(r) for r in reqs]
        return self.ncost.step_time(reqs[0].model, tokens, a.group.degree)

    def _paused_by_id(self) -> dict[str, NodeStatus]:
        if self._paused is None:
            self._paused = {s.id: s for s in self.view.paused}
        return self._paused

    def _reads_outside(self, a: Assignment) -> bool:
        paused = self._paused_by_id()
        for rid in (*a.batch, *a.offload):
            s = paused.get(rid)
            if s is not None and s.group is not None and s.group.mask & ~a.group.mask:
                return True
        return False


def best_group(
    node: Node, placer: Placer, degree: int, home: Group | None, avoid: int = 0,
    stuck: int = 0,
) -> Group | None:
    """A free group of ``degree``: the request's ``home`` group if free, else the one whose
    enclosing larger groups are the most occupied (keeps large groups whole), lowest first;
    never one overlapping the device mask ``avoid``, and only one holding every device of
    ``stuck`` (the request's state on devices still busy: ``Placer.stuck``; a move from
    them would wait for their job)."""
    if home is not None and home.degree == degree and placer.is_free(home):
        if not home.mask & avoid:
            return home
    best, best_key = None, None
    for g in node.groups(degree):
        if not placer.is_free(g) or g.mask & avoid or stuck & ~g.mask:
            continue
        key = []
        parent = node.parent(g)
        while parent is not None:
            key.append(-(parent.mask & ~placer.available).bit_count())
            parent = node.parent(parent)
        key = (tuple(key), g.index)
        if best_key is None or key < best_key:
            best, best_key = g, key
    return best
