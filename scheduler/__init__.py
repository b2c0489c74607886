"""ditmem.scheduler — step scheduling policies, cost model, simulator, workloads, metrics.

Pure Python (no torch, nothing else of ditmem): the same policy objects drive the real engine
and the simulator (``simulate``). Times are seconds on the engine's clock; sizes are bytes;
memory is seen only as page counts.

How an engine uses it
---------------------
Set-up, once::

    from ditmem.scheduler import (CostModel, Location, MemoryState, Request, RequestStatus,
                                  SchedulerView, StepReport, WaitingQueue, make_policy)
    cost = CostModel.load("cpu-tiny")        # a shipped profile name, or a JSON path
    policy = make_policy("slo", cost)        # "fifo" | "srtf" | "slo"
    waiting = WaitingQueue()                 # arrived, not started (engine owns it)
    active: dict[str, RequestStatus] = {}    # started: running or paused (engine owns it)

On arrival of a request::

    req = Request(id, arrival=now, model="qwen-image", width=..., height=..., frames=1,
                  steps=..., priority=0|1|2, slo_ms=None|ms)
    cost.assign_deadline(req, slo_scale=3.0)  # sets req.standalone_s and req.deadline
    waiting.push(req)

Each iteration::

    view = SchedulerView(active=list(active.values()), waiting=waiting,
                         memory=MemoryState(total_pages, free_pages, page_bytes,
                                            host_free_pages),
                         last_batch=tuple(previous plan.batch),
                         max_active=64)         # the engine's cap on started requests
    plan = policy.schedule(now, view)         # a StepPlan
    if plan.idle: sleep until the next arrival (or transfer completion); continue
    1. for id in plan.offload: copy its pages device -> host; status.location = Location.HOST
       (its device pages are free once the copy finished)
    2. for id in plan.restore: copy its pages back into any free device pages;
       status.location = Location.DEVICE
    3. for id in plan.admit: req = waiting.remove(id); allocate cost.pages_for(req, page_bytes)
       pages; encode the prompt; active[id] = RequestStatus(req, started_at=now, pages=n)
    4. run ONE denoising step for every id in plan.batch as one packed forward (all same
       model, all on device); status.steps_done += 1; a request reaching request.steps is
       VAE-decoded, finished, its pages freed and removed from ``active``
    5. for id in plan.pause: active[id].preemptions += 1   (informational)
    6. policy.observe(StepReport(now, plan.batch, model, [cost.tokens(r) ...], step_s,
                                 encode_s, decode_s, transfer_s, finished,
                                 encoded=[admitted requests], decoded=[decoded requests],
                                 transfer_bytes=bytes moved))

The policy guarantees: batch members share one model and number at most
``cost.max_batch(model)``; admits and restores fit in the free pages once the offloads are
done (offloads only when the host pool has room); admits never take the started count past
``view.max_active``; nothing that arrived is ever dropped (a request that can no longer
meet its deadline still runs to completion). Policies see only what the engine shows them
(never the future).

Block-level preemption (``SchedulerView.preemption = "block"``): run ``plan.blocks`` blocks
(None: ``policy.chunk_blocks([requests])``) of the batch's step instead of the whole step
(``ditmem.models.common.chunked.ChunkRunner.run_chunk``); set each member's ``status.blocks_done``
(0 again when the step completes), ``status.step_group`` (the batch's ids) and report
``StepReport.blocks``. A part-done step must continue as exactly that batch; when a plan
leaves it out, park it (``ChunkRunner.park``: its boundary activations go to the host
asynchronously; ``status.activations`` = DEVICE while in flight, HOST once landed) and
``resume`` it before its next chunk. ``ditmem.scheduler.simulator`` models exactly this.

Cost model feedback: ``policy.observe(report)`` forwards to ``cost.observe(report)``, which
keeps correction factors (EWMAs of measured / predicted) for steps per shape class, encodes,
decodes per size class and transfers, so a profile that is off converges to the device's
real speeds. The simulator draws its device's times around the profile
(``ditmem.scheduler.noise.TimingNoise``) from its own uncorrected copy. ``ditmem profile`` writes a
measured profile in the format documented in ``ditmem.scheduler.profiles`` (kind "table").

Requests leave the policy's view when the engine removes them: a cancelled waiting request
is ``waiting.remove(id)``; a cancelled started one is dropped from ``active`` (and its pages
freed) — the next ``schedule`` simply no longer sees it.

Simulation and analysis (same objects, no engine):
``workload(name, cost, load=, requests=, seed=, arrival="poisson"|"gamma:CV", scale=)``
(``ditmem.scheduler.workloads``) makes the named workloads; ``simulate(requests, policy)``
(``.simulator``) replays the loop as a deterministic discrete-event simulation (decode
inline, on a concurrent worker, or tile by tile: ``decode=``);
``summarize(records)`` (``.metrics``) gives attainment, P50/P95/P99/mean, per priority;
``min_misses`` (``.bound``) is a lower bound on any policy's misses (each request's least
work the profile allows, Moore–Hodgson windows) and ``clairvoyant_misses`` what an offline
EDF schedule that knows every arrival reaches;
``run_point`` / ``goodput`` (``.experiment``) and the ``ditmem sim`` CLI (``.cli``) tie them
together.
"""

from .cost import DEFAULT_PAGE_BYTES, CostModel
from .plan import MemoryState, PendingDecode, SchedulerView, StepPlan, StepReport
from .policies import POLICIES, Policy, make_policy
from .profiles import PROFILE_NAMES, ProfileError, load_profile
from .queue import WaitingQueue
from .request import PRIORITY_WEIGHTS, Location, Request, RequestStatus

__all__ = [
    "DEFAULT_PAGE_BYTES",
    "POLICIES",
    "PRIORITY_WEIGHTS",
    "PROFILE_NAMES",
    "CostModel",
    "Location",
    "MemoryState",
    "PendingDecode",
    "Policy",
    "ProfileError",
    "Request",
    "RequestStatus",
    "SchedulerView",
    "StepPlan",
    "StepReport",
    "WaitingQueue",
    "load_profile",
    "make_policy",
]
