"""Build an engine from names: model, policy, profile, dtype, pool sizes.

Memory sizing (``make_pools``), vLLM-style: the model is loaded first; the device page pool
then takes ``memory_fraction`` of the device memory still free (the rest is headroom for
activations and the allocator), unless ``pool_mb`` fixes its size. The host pool is its
own setting (``host_memory_gb``), allocated in chunks and pinned for CUDA/NPU devices.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field

from ditmem.engine.loop import Engine

logger = logging.getLogger(__name__)

MIB = 2**20
GIB = 2**30
#: default ``memory_fraction`` on an accelerator when neither it nor ``pool_mb`` is given
DEFAULT_MEMORY_FRACTION = 0.9
#: default pool on the CPU when neither ``memory_fraction`` nor ``pool_mb`` is given
DEFAULT_CPU_POOL_MB = 64.0
SCHEDULER_MODEL = {"tiny-qwen-image": "qwen-image", "tiny-wan": "wan2.2-a14b"}


@dataclass(slots=True)
class EngineConfig:
    """What ``ditmem serve`` / ``ditmem demo`` choose. ``pool_mb``: device page pool
    (request state only; weights are separate); ``host_mb``: host pool for offload
    (default 4x the pool); ``page_kb``: page size; ``profile``: cost-model profile name or
    JSON path (``cpu-tiny`` for the embedded models on a CPU), or "auto"/"measure": measured
    on this device at start (``engine.profile.startup_profile``; ``profile_frames`` frames per
    timed request); ``preemption``: "step" or
    "block" (pause inside steps, between chunks of blocks); ``decode``: "auto" (fifo:
    inline, the others: tiled, where the model can tile), "inline" or "tiled";
    ``decode_tile``: (tile, stride) pixels of VAE decode tiles, None: whole decodes.
    ``dtype``: model dtype name or None (bf16 on CUDA/NPU, fp32 on CPU);
    ``memory_fraction``: page pool = this fraction of the device memory free after the
    weights (default 0.9 on CUDA/NPU; on the CPU: of MemAvailable less the host pool), used
    when ``pool_mb`` is None (64 MB on the CPU when both are None); ``host_memory_gb``: the
    host pool (default ``host_mb``, else 4x the pool capped at half the free host RAM).
    ``policy_options``: keyword options of ``policy``'s constructor (``serve --opt``)."""

    model: str = "tiny-qwen-image"
    policy: str = "slo"
    profile: str = "cpu-tiny"
    pool_mb: float | None = None
    host_mb: float | None = None
    page_kb: int = 64
    max_active: int = 64
    max_queued: int = 256
    device: str = "cpu"
    slo_scale: float = 3.0
    decode_workers: int = 0
    preemption: str = "step"
    decode: str = "auto"
    decode_tile: tuple[int, int] | None = (256, 224)
    dtype: str | None = None
    memory_fraction: float | None = None
    host_memory_gb: float | None = None
    profile_frames: int = 1
    policy_options: dict = field(default_factory=dict)


def resolve_decode(choice: str, policy: str, generator) -> tuple[str, bool]:
    """(decode mode, whether tiles apply) for ``choice`` ("auto" | "inline" | "tiled"):
    "auto" runs fifo to completion (inline) and tiles for the other policies; models
    without a tiled decode decode whole, inline."""
    from ditmem.models.common.tiled_decode import supports_tiled_decode

    tiles = supports_tiled_decode(generator)
    if choice == "auto":
        return ("tiled" if tiles and policy != "fifo" else "inline"), tiles
    return choice, tiles


def scheduler_model(model: str, generator=None) -> str:
    """The cost model's key for a ditmem model name (or the generator's own answer)."""
    key = getattr(generator, "scheduler_model", None)
    if key:
        return key
    if model in SCHEDULER_MODEL:
        return SCHEDULER_MODEL[model]
    return "wan2.2-a14b" if "wan" in model.lower() else "qwen-image"


def _free_device_bytes(device) -> tuple[int, int]:
    """(free, total) bytes of ``device``'s memory now. CPU: MemAvailable / MemTotal."""
    import torch

    device = torch.device(device)
    if device.type in ("cuda", "npu"):
        mod = torch.get_device_module(device.type)
        mod.empty_cache()
        return mod.mem_get_info(device)
    return _meminfo("MemAvailable"), _meminfo("MemTotal")


def _meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/meminfo has no {field}")


def pool_sizes(config: EngineConfig, device) -> tuple[int, int]:
    """(device pool bytes, host pool bytes) for ``config`` on ``device``, measured now (call
    it after loading the model: the fraction is of the memory the weights left free)."""
    import torch

    if config.pool_mb is not None and config.memory_fraction is not None:
        raise ValueError("memory_fraction: give --memory-fraction or --pool-mb, not both")
    if config.host_mb is not None and config.host_memory_gb is not None:
        raise ValueError("host_memory_gb: give --host-memory-gb or --host-mb, not both")
    accel = torch.device(device).type != "cpu"
    fraction = config.memory_fraction
    if config.pool_mb is None and fraction is None and accel:
        fraction = DEFAULT_MEMORY_FRACTION
    host = None
    if config.host_memory_gb is not None:
        host = int(config.host_memory_gb * GIB)
    elif config.host_mb is not None:
        host = int(config.host_mb * MIB)
    if fraction is not None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"memory_fraction: expected a fraction in (0, 1], got {fraction}")
        free, _ = _free_device_bytes(device)
        if not accel:  # the CPU "device" pool and the host pool share the same RAM
            free -= host if host is not None else 0
        pool = int(fraction * max(0, free))
        logger.info("page pool: %.2f of %.1f GiB free on %s after the weights = %.1f GiB",
                    fraction, free / GIB, device, pool / GIB)
    else:
        pool = int((config.pool_mb if config.pool_mb is not None else DEFAULT_CPU_POOL_MB)
                   * MIB)
    if host is None:
        host = 4 * pool
        if accel:
            host = min(host, _meminfo("MemAvailable") // 2)
    return pool, host


def make_pools(config: EngineConfig, device: str):
    """The device ``PagePool`` and the ``HostPool`` sized by ``config`` (:func:`pool_sizes`);
    ValueError when a pool would hold no page."""
    from ditmem.memory import HostPool, PagePool

    page_bytes = config.page_kb * 1024
    pool_bytes, host_bytes = pool_sizes(config, device)
    pages, host_pages = pool_bytes // page_bytes, host_bytes // page_bytes
    if pages < 1:
        raise ValueError(f"pool: {pool_bytes} bytes hold no {config.page_kb} KiB page "
                         f"(--pool-mb / --memory-fraction)")
    if host_pages < 1:
        raise ValueError(f"host pool: {host_bytes} bytes hold no {config.page_kb} KiB page "
                         f"(--host-memory-gb / --host-mb)")
    pool = PagePool(pages, page_bytes, device)
    host = HostPool(host_pages, page_bytes, device=device)
    logger.info("pools: device %d pages (%.1f MiB), host %d pages (%.1f MiB, %d chunks, "
                "pinned=%s) of %d KiB", pages, pages * page_bytes / MIB, host_pages,
                host_pages * page_bytes / MIB, host.num_chunks, host.is_pinned,
                config.page_kb)
    return pool, host


def add_model_arguments(p: argparse.ArgumentParser, *, memory: bool = True) -> None:
    """``--dtype`` (and with ``memory``: ``--memory-fraction``, ``--host-memory-gb``)."""
    from ditmem.models.common.dtypes import CHOICES

    p.add_argument("--dtype", choices=CHOICES, default=None,
                   help="model dtype (default: bfloat16 on cuda/npu, float32 on cpu)")
    if not memory:
        return
    p.add_argument("--memory-fraction", type=float, default=None,
                   help="page pool = this fraction of the device memory free after the "
                        "weights are loaded (default 0.9 on cuda/npu; on cpu: of "
                        "MemAvailable minus the host pool); exclusive with --pool-mb")
    p.add_argument("--host-memory-gb", type=float, default=None,
                   help="host (offload) pool in GiB, allocated in 1 GiB chunks, pinned for "
                        "cuda/npu (default 4x the device pool, at most half the free RAM)")


def make_policy_and_cost(policy: str, profile, options: dict | None = None):
    """A fresh ``(policy, cost)`` pair; ``profile`` is a name, a JSON path or a ``CostModel``;
    ``options``: the policy's constructor options. The policy predicts with an
    :class:`ExactPagesCost` over the profile."""
    from ditmem.engine.accounting import ExactPagesCost
    from ditmem.scheduler import CostModel, make_policy

    base = profile if isinstance(profile, CostModel) else CostModel.load(profile)
    cost = ExactPagesCost(base)
    return make_policy(policy, cost, **(options or {})), cost


def build_engine(config: EngineConfig, generator=None, cost=None) -> Engine:
    """An (unstarted) engine; loads the model and the profile unless given."""
    from ditmem import models

    if generator is None:
        generator = models.load(config.model, device=config.device, dtype=config.dtype)
    if cost is None:
        from ditmem.tools.profile import startup_profile

        profile = startup_profile(generator, config.model, config.device, config.profile,
                                  frames=config.profile_frames, page_kb=config.page_kb)
    policy, cost = make_policy_and_cost(config.policy, cost or profile, config.policy_options)
    key = scheduler_model(config.model, generator)
    try:
        cost.max_batch(key)
    except ValueError as exc:
        raise ValueError(f"profile: {exc}; measure one with `ditmem profile --model "
                         f"{config.model} --out FILE` and pass --profile FILE") from None
    pool, host = make_pools(config, config.device)
    decode, tiles = resolve_decode(config.decode, config.policy, generator)
    return Engine(generator, policy, cost, pool, host, model=key,
                  max_active=config.max_active, max_queued=config.max_queued,
                  slo_scale=config.slo_scale, decode_workers=config.decode_workers,
                  preemption=config.preemption, decode=decode,
                  decode_tile=config.decode_tile if tiles else None)
