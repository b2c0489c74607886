"""Building a node service for ``ditmem serve --devices N``: the profile (saved, packaged or
measured at start), the device workers, the speed-up table and link rates measured on them
when the profile lacks them, and a started :class:`~ditmem.parallel.serving.NodeService`."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ditmem.parallel.node_profile import measure_node_sections
from ditmem.parallel.serving import NodeService

log = logging.getLogger(__name__)


def build_node_service(config, devices: int, *,
                       parallel_sides: tuple[int, ...] = (128, 256, 512),
                       log: Callable[[str], None] = log.warning) -> NodeService:
    """A started :class:`NodeService` for ``ditmem serve --devices N`` (``config``: the
    server's ``EngineConfig``). The profile: ``config.profile`` when its JSON has the
    node's ``parallel`` and ``links`` sections (``ditmem profile --devices N --out F``, or
    a saved ``ditmem demo --devices`` profile); otherwise its single-device part (measured
    at start for "auto"/"measure") with the speed-up table and links measured on the
    workers now (``speedup.calibrate``; an implausible table refuses to start).
    ValueError for settings the node cannot serve."""
    import json
    import os

    from ditmem.engine.factory import pool_sizes, scheduler_model
    from ditmem.parallel.front_model import load_for_checks
    from ditmem.parallel.node import NodeEngine
    from ditmem.scheduler import CostModel
    from ditmem.scheduler.node.policies import NODE_POLICIES

    if devices < 2:
        raise ValueError(f"devices: a node serves on 2 or more devices, got {devices}")
    if config.device == "cpu" and devices > (os.cpu_count() or 1):
        raise ValueError(f"devices: --devices {devices} exceeds the {os.cpu_count()} cores "
                         "of this machine (one worker process per core)")
    if config.policy not in NODE_POLICIES:
        raise ValueError(f"policy: a node runs {', '.join(sorted(NODE_POLICIES))}, got "
                         f"{config.policy!r}")
    if config.device not in ("cpu", "cuda", "npu"):
        raise ValueError(f"device: cpu, cuda or npu for a node, got {config.device!r}")
    # the front checks requests only: the model's configs and tokenizer, no weights
    gen = load_for_checks(config.model, config.dtype)
    key = scheduler_model(config.model, gen)
    profile = _node_profile(config, gen, key)
    pool_bytes, host_bytes = pool_sizes(config, "cpu" if config.device == "cpu" else
                                        f"{config.device}:0")
    page = config.page_kb * 1024
    pages, host_pages = max(1, pool_bytes // page), max(1, host_bytes // page)
    log(f"node: {devices} {config.device} devices, {pages} pages of {config.page_kb} KiB "
        f"per device, {host_pages} host pages each; starting the workers ...")
    node = NodeEngine(config.model, devices, device_type=config.device, pool_pages=pages,
                      page_bytes=page, host_pages=host_pages,
                      model_kwargs={"dtype": config.dtype})
    try:
        if "parallel" not in profile or "links" not in profile:
            measure_node_sections(node, profile, key, parallel_sides, log,
                                  tool="ditmem serve --devices")
        else:
            if "move_latency_s" not in profile["links"]:
                from ditmem.parallel.move_latency import add_move_latency

                add_move_latency(node, profile["links"], log)
            if "job_latency_s" not in profile["links"]:
                from ditmem.parallel.job_latency import add_job_latency

                add_job_latency(node, profile["links"], log)
        cost = CostModel.from_dict(profile)
        cost.max_batch(key)
        service = NodeService(node, gen, cost, policy=config.policy, model=key,
                              max_active=config.max_active, max_queued=config.max_queued,
                              slo_scale=config.slo_scale, decode_tile=config.decode_tile,
                              policy_options=config.policy_options)
    except BaseException:
        node.close()
        raise
    log(f"node: serving with policy {config.policy} "
        f"(speed-up table: {json.dumps(profile['parallel'][key].get('speedup'))})")
    return service.start()


def _node_profile(config, gen, key: str) -> dict:
    """The profile as a dict: a JSON path as it is, a name from the packaged profiles,
    or the single-device part measured at start ("auto"/"measure"; ``gen`` is the front's
    weightless generator: a measurement loads the model for itself and drops it before
    the workers start)."""
    import gc
    import json
    import os

    from ditmem import models
    from ditmem.scheduler.profiles import load_profile
    from ditmem.tools.profile import startup_profile, will_measure

    if will_measure(config.model, "cpu", config.profile, key):
        gen = models.load(config.model, dtype=config.dtype)
    choice = startup_profile(gen, config.model, "cpu", config.profile,
                             frames=config.profile_frames, page_kb=config.page_kb)
    del gen
    gc.collect()
    if not os.path.isfile(choice):
        return load_profile(choice)
    with open(choice) as f:
        return json.load(f)
