"""The control path between the node engine and its device workers: small picklable
records only (ids, shapes, page numbers, timings). Tensors never travel here: latent rows
move over the device link (collectives) or through shared-memory host pages, decoded
images (and a split decode's latents and tiles) through shared-memory segments."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ditmem.models.common.request import GenerationRequest


@dataclass(slots=True)
class Encode:
    """Encode ``request`` on this device (degree 1); its id is ``request.request_id``."""

    request: GenerationRequest


@dataclass(slots=True)
class Step:
    """One whole denoising step of ``request_ids`` packed together on ``devices`` (every
    device of the group gets the same command; degree = ``len(devices)``)."""

    request_ids: list[str]
    devices: tuple[int, ...]


@dataclass(slots=True)
class Reshard:
    """Move ``request_id`` from ``old`` to ``new`` devices over the device link, point to
    point; sent to exactly the devices of ``old`` and ``new``. With ``cover`` (the
    baseline of ``bench_moves``): a collective over that aligned group containing both,
    sent to every device of it."""

    request_id: str
    old: tuple[int, ...]
    new: tuple[int, ...]
    cover: tuple[int, ...] | None = None


@dataclass(slots=True)
class Offload:
    """Park this device's part of ``request_id`` in its host pool; replies a
    ``state_moves.HostCopy``."""

    request_id: str


@dataclass(slots=True)
class Adopt:
    """Restore ``request_id`` onto ``devices`` (this device's shard) from the host copies
    ``parts`` (any workers' host pools)."""

    request_id: str
    parts: list[Any]
    devices: tuple[int, ...]


@dataclass(slots=True)
class DropHost:
    """Free the host pages of this device's parked part of ``request_id``."""

    request_id: str


@dataclass(slots=True)
class Decode:
    """VAE-decode ``request_id`` (held at degree 1 here), tile by tile when ``tile`` is
    ``(tile_px, stride_px)`` and the model can (the VAE's own tiled decode), else whole; the
    image comes back in a shared-memory segment (``SharedImage``)."""

    request_id: str
    tile: tuple[int, int] | None = None


@dataclass(slots=True)
class ShareLatent:
    """Start the tiled decode (``tile`` = ``(tile_px, stride_px)``) of ``request_id``, held
    at degree 1 here, and put its de-normalised latents in a shared-memory segment
    (``SharedTensor``) for the other devices of a split decode; replies (the segment, the
    decode's number of tiles)."""

    request_id: str
    tile: tuple[int, int]


@dataclass(slots=True)
class DecodeTiles:
    """Decode tiles ``indices`` (row-major) of ``request_id``'s tiled decode: on the device
    that holds it (``latent`` None; the decode ``ShareLatent`` started, the tiles kept for
    ``BlendTiles``), or on another device from ``latent`` (replies one ``SharedTensor`` per
    tile, in ``indices`` order)."""

    request_id: str
    tile: tuple[int, int]
    indices: list[int]
    latent: SharedTensor | None = None


@dataclass(slots=True)
class BlendTiles:
    """Finish ``request_id``'s split decode here: put the other devices' ``tiles`` (index →
    segment) beside its own and blend them (the VAE's own tiled-decode blend); the image
    comes back in a shared-memory segment (``SharedImage``)."""

    request_id: str
    tiles: dict[int, SharedTensor]


@dataclass(slots=True)
class Release:
    """Free every page (device and host) this device holds for ``request_id``."""

    request_id: str


@dataclass(slots=True)
class LinkProbe:
    """Time ``repeats`` broadcasts of ``nbytes`` from the first of ``devices`` to the
    others over the group's process group; replies the median seconds of one."""

    devices: tuple[int, ...]
    nbytes: int
    repeats: int = 5


@dataclass(slots=True)
class Stats:
    """Page counts and held requests of this device."""


@dataclass(slots=True)
class Stop:
    """Leave the process groups and exit."""


@dataclass(slots=True)
class SharedImage:
    """A decoded image in shared memory segment ``name``: ``shape``, numpy ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(slots=True)
class SharedTensor:
    """A tensor in shared memory segment ``name``: ``shape``, torch ``dtype`` name (e.g.
    "float32", "bfloat16"), on the host."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(slots=True)
class DeviceStats:
    """device_pages / host_pages: used pages of the device pool / host pool; held: request
    ids with a part on the device; parked: with a part in host pages."""

    device: int
    device_pages: int
    host_pages: int
    held: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Reply:
    """What a worker answers: ``ok`` with ``value``, or the ``error`` text; ``seconds`` the
    command took on the worker (wall) and ``cpu_seconds`` the CPU time of the worker's
    main thread in it (the one running the model with one torch thread: busy time, without
    waits for a core or for peers, nor the collective backend's own threads);
    ``process_cpu_seconds`` the CPU time of every thread of the worker in it (the
    collective backend's copies included); ``device_pages`` used after it; ``started_at``
    when the worker began the command (``time.perf_counter``: CLOCK_MONOTONIC, the same
    clock in every process of the machine), so the engine can tell the time a command
    waited behind the worker's previous one from the command's own; ``request_pages``
    the pages (device or host) this device holds after it for each request the command
    named (0: none any more), from which the engine tracks each request's peak."""

    device: int
    ok: bool
    value: Any = None
    error: str = ""
    seconds: float = 0.0
    device_pages: int = 0
    cpu_seconds: float = 0.0
    process_cpu_seconds: float = 0.0
    started_at: float = 0.0
    request_pages: dict[str, int] = field(default_factory=dict)
