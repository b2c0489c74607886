"""The node baselines.

* ``fifo`` — today's vllm-omni deployment: D/d static replicas at a fixed degree d
  (``baseline_degree``), one global FIFO queue, run to completion (one request per replica,
  one job per request: its remaining time pays ``links.job_latency_s`` once).
* ``srtf`` — the same static replicas; every step goes to the request (waiting or paused,
  anywhere on the node) with the least predicted work left at degree d; a paused request
  resumes on any free replica (migrated by a peer copy when it is another one).
* ``elastic-np`` — TetriServe-style: when a request starts (earliest deadline first), the
  least degree whose predicted time alone still meets its deadline, on a free group of at
  least that degree (backfilling past requests that do not fit); a request that cannot make
  it at any degree runs at degree 1 after the others; never preempted, degree fixed.
"""

from __future__ import annotations

from ..cost import NodeCost
from ..plan import NodePlan, NodeView
from ..topology import Node
from .base import NodePolicy, Placer, best_group


class _Static(NodePolicy):
    def __init__(self, ncost: NodeCost, node: Node, *, baseline_degree: int = 1):
        super().__init__(ncost, node)
        self.replicas = node.groups(baseline_degree)
        self.degree = baseline_degree


class StaticFifo(_Static):
    name = "fifo"
    steps_per_job = None  # a job per request

    def schedule(self, view: NodeView) -> NodePlan:
        placer = Placer(view, self.ncost)
        free = [g for g in self.replicas if placer.is_free(g)]
        for g, r in zip(free, view.waiting.iter_by("arrival", len(free)), strict=False):
            placer.take(g, [r], r.steps)
        return placer.plan()


class StaticSrtf(_Static):
    name = "srtf"

    def schedule(self, view: NodeView) -> NodePlan:
        placer = Placer(view, self.ncost)
        free = [g for g in self.replicas if placer.is_free(g)]
        if not free:
            return placer.plan()
        d, rem, per = self.degree, self.ncost.remaining, self.steps_per_job  # a job per step
        keyed = [((rem(s.request, s.steps_done, d, per), s.request.arrival), s)
                 for s in view.paused]
        keyed += [
            ((rem(r, 0, d, per), r.arrival), r) for r in view.waiting.iter_by("size", len(free))
        ]
        keyed.sort(key=lambda pair: pair[0])
        for _, item in keyed[: len(free)]:
            home = getattr(item, "group", None)
            g = home if home in free and placer.is_free(home) else None
            g = g or next((f for f in free if placer.is_free(f)), None)
            if g is not None:
                placer.take(g, [item], 1)
        return placer.plan()


class ElasticNp(NodePolicy):
    name = "elastic-np"
    steps_per_job = None  # a job per request

    def __init__(self, ncost: NodeCost, node: Node, *, window: int = 64):
        super().__init__(ncost, node)
        self.window = window

    def schedule(self, view: NodeView) -> NodePlan:
        placer = Placer(view, self.ncost)
        late = []
        for r in view.waiting.iter_by("deadline", self.window):
            if not placer.available:
                break
            need = next(
                (
                    d
                    for d in self.node.degrees
                    if view.now + self.ncost.remaining(r, 0, d, None) <= r.deadline
                ),
                None,
            )
            if need is None:
                late.append(r)
                continue
            for d in (d for d in self.node.degrees if d >= need):
                g = best_group(self.node, placer, d, None)
                if g is not None:
                    placer.take(g, [r], r.steps)
                    break
        for r in late:
            g = best_group(self.node, placer, 1, None)
            if g is None:
                break
            placer.take(g, [r], r.steps)
        return placer.plan()
