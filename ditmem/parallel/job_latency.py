"""The fixed cost of a job on the node engine, measured at start-up.

The node loop (``ditmem.scheduler.node.simulator.run_node``) hands each group a job through
``EngineDevices.launch`` and sees it end through ``EngineDevices.wait``. Between the two
lie the job's stages as the workers time them (moves, encodes, steps, decodes) and a fixed
part no stage holds: the launch command to the group's workers, the job's thread, the
completion's way back to the loop. The fixed part is what ``links.job_latency_s`` prices
(``ditmem.scheduler.node.speedup.Links``: seconds per job). :func:`measure_job_latency`
launches one-step jobs of a tiny request (a 32² image: its step takes milliseconds) on an
idle device through that same path and takes the median of (the loop's span − the stages
the workers report) over repeats.
"""

from __future__ import annotations

import statistics

from ditmem.models.common.request import GenerationRequest
from ditmem.parallel.move_latency import record_measured

#: the probe request's side (pixels) and id
PROBE_SIDE = 32
PROBE_ID = "ditmem-job-probe"
#: steps the probe request is encoded with (more than any number of repeats steps)
_PROBE_STEPS = 1000


def measure_job_latency(node, repeats: int = 9, device: int = 0, *,
                        model: str = "qwen-image") -> dict:
    """Median seconds per job on ``node`` (idle: nothing else may run) besides its stages:
    ``repeats`` one-step jobs of a tiny request on ``device``, each launched and waited for
    through ``EngineDevices`` (the loop's path), after one unmeasured warm-up job. Each
    job's gap is its span (``Completion.finished − started``, the loop's clock) minus its
    stages as the workers measured them (``Timings.total`` without waits). ``model``: the
    scheduler's model name of the probe (its jobs carry it; the workers ignore it).
    Returns ``job_latency_s`` (the median gap), ``gaps_s`` (each), ``span_s`` and
    ``stages_s`` (medians), ``jobs``."""
    from ditmem.parallel.devices import EngineDevices
    from ditmem.scheduler import Request
    from ditmem.scheduler.node.device import Job
    from ditmem.scheduler.node.topology import Group

    if repeats < 1:
        raise ValueError(f"repeats: expected >= 1, got {repeats}")
    if not 0 <= device < node.num_devices:
        raise ValueError(f"device: one of 0..{node.num_devices - 1}, got {device}")
    probe = GenerationRequest("job probe", width=PROBE_SIDE, height=PROBE_SIDE,
                              num_inference_steps=_PROBE_STEPS, seed=0, request_id=PROBE_ID)
    if not node.encode(probe, device):
        raise RuntimeError(f"measure_job_latency: no room on device {device} for the probe")
    request = Request(PROBE_ID, 0.0, model, PROBE_SIDE, PROBE_SIDE, 1, _PROBE_STEPS)

    def no_encodes(r):  # the probe's jobs encode nothing (it is encoded above)
        raise RuntimeError(f"measure_job_latency: job asked to encode {r.id}")

    devices = EngineDevices(node, no_encodes)
    spans, stages, gaps = [], [], []
    try:
        for i in range(repeats + 1):
            job = Job(i, Group(1, device), [request], 1)
            now = devices.now()
            devices.launch(job, now)
            (done,) = devices.wait(None)
            if devices.errors:
                raise RuntimeError(f"measure_job_latency: {devices.errors[-1]}")
            if i == 0:
                continue  # warm-up: the first job's thread and command path
            t = done.timings
            span, own = done.finished - done.started, t.total - t.wait_s
            spans.append(span)
            stages.append(own)
            gaps.append(max(0.0, span - own))
    finally:
        node.release(PROBE_ID)
    return {"job_latency_s": statistics.median(gaps), "gaps_s": gaps,
            "span_s": statistics.median(spans), "stages_s": statistics.median(stages),
            "jobs": len(gaps),
            "probe_note": f"one step of a {PROBE_SIDE}x{PROBE_SIDE} request per job, launched "
                          "and waited for through EngineDevices as the node loop does"}


def add_job_latency(node, links: dict, log=None, repeats: int = 9) -> dict:
    """Measure (:func:`measure_job_latency`) and write ``links["job_latency_s"]`` (and the
    measurement beside it, ``links["job_latency_measured"]``); returns the measurement."""
    m = measure_job_latency(node, repeats)
    record_measured(links, "job_latency_s", m,
                    f"median over {m['jobs']} one-step jobs of a tiny request")
    if log is not None:
        log(f"job latency: {1e3 * m['job_latency_s']:.2f} ms per job besides its stages "
            f"(median; span {1e3 * m['span_s']:.2f} ms, stages {1e3 * m['stages_s']:.2f} ms)")
    return m
