"""What every node policy offers, and the placement helper they share."""

from __future__ import annotations

from ..cost import NodeCost
from ..plan import Assignment, NodePlan, NodeStatus, NodeView
from ..topology import Group, Node


class NodePolicy:
    """Base class: ``schedule(view) -> NodePlan`` whenever devices are idle and something
    changed; ``observe(report)`` after every job (feeds the step-time correction)."""

    name = "base"

    def __init__(self, ncost: NodeCost, node: Node):
        self.ncost = ncost
        self.node = node

    def schedule(self, view: NodeView) -> NodePlan:
        raise NotImplementedError

    def observe(self, report) -> None:
        self.ncost.observe_step(
            report.model, report.tokens, report.group.degree, report.steps, report.step_s
        )


class Placer:
    """One decision's free devices, pages and started count, consumed as groups are taken.

    ``take(group, members, steps)`` returns the Assignment (parking paused requests resident
    on the group, latest deadline first, when its devices lack pages) or None when the group
    is not free, the pages cannot be found or an admit would pass the started cap.
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
                and s.id not in self.taken
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

    def plan(self) -> NodePlan:
        return NodePlan(self.assignments)


def best_group(
    node: Node, placer: Placer, degree: int, home: Group | None, avoid: int = 0
) -> Group | None:
    """A free group of ``degree``: the request's ``home`` group if free, else the one whose
    enclosing larger groups are the most occupied (keeps large groups whole), lowest first;
    never one overlapping the device mask ``avoid``."""
    if home is not None and home.degree == degree and placer.is_free(home):
        if not home.mask & avoid:
            return home
    best, best_key = None, None
    for g in node.groups(degree):
        if not placer.is_free(g) or g.mask & avoid:
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
