"""Build an engine from names: model, policy, profile, pool sizes."""

from __future__ import annotations

from dataclasses import dataclass

from ditmem.engine.loop import Engine

MIB = 2**20
SCHEDULER_MODEL = {"tiny-qwen-image": "qwen-image", "tiny-wan": "wan2.2-a14b"}


@dataclass(slots=True)
class EngineConfig:
    """What ``ditmem serve`` / ``ditmem demo`` choose. ``pool_mb``: device page pool
    (request state only; weights are separate); ``host_mb``: host pool for offload
    (default 4x the pool); ``page_kb``: page size; ``profile``: cost-model profile name or
    JSON path (``cpu-tiny`` for the embedded models on a CPU); ``preemption``: "step" or
    "block" (pause inside steps, between chunks of blocks); ``decode``: "auto" (fifo:
    inline, the others: tiled, where the model can tile), "inline" or "tiled";
    ``decode_tile``: (tile, stride) pixels of VAE decode tiles, None: whole decodes."""

    model: str = "tiny-qwen-image"
    policy: str = "slo"
    profile: str = "cpu-tiny"
    pool_mb: float = 64.0
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


def resolve_decode(choice: str, policy: str, generator) -> tuple[str, bool]:
    """(decode mode, whether tiles apply) for ``choice`` ("auto" | "inline" | "tiled"):
    "auto" runs fifo to completion (inline) and tiles for the other policies; models
    without a tiled decode decode whole, inline."""
    from ditmem.models.tiled_decode import supports_tiled_decode

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


def make_pools(config: EngineConfig, device: str):
    """The device ``PagePool`` and the ``HostPool`` sized by ``config``."""
    from ditmem.memory import HostPool, PagePool

    page_bytes = config.page_kb * 1024
    pages = max(1, int(config.pool_mb * MIB) // page_bytes)
    host_pages = max(1, int((config.host_mb or 4 * config.pool_mb) * MIB) // page_bytes)
    pool = PagePool(pages, page_bytes, device)
    host = HostPool(host_pages, page_bytes, device=device)
    return pool, host


def make_policy_and_cost(policy: str, profile):
    """A fresh ``(policy, cost)`` pair; ``profile`` is a name, a JSON path or a ``CostModel``.
    The policy predicts with an :class:`ExactPagesCost` over the profile."""
    from ditmem.engine.accounting import ExactPagesCost
    from ditmem.scheduler import CostModel, make_policy

    base = profile if isinstance(profile, CostModel) else CostModel.load(profile)
    cost = ExactPagesCost(base)
    return make_policy(policy, cost), cost


def build_engine(config: EngineConfig, generator=None, cost=None) -> Engine:
    """An (unstarted) engine; loads the model and the profile unless given."""
    from ditmem import models

    if generator is None:
        generator = models.load(config.model, device=config.device)
    policy, cost = make_policy_and_cost(config.policy, cost or config.profile)
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
