"""Devices of a node, their aligned groups, and the process groups created once at start.

A node has ``D`` devices (a power of two, or any count: groups never straddle past it).
An *aligned group* of size ``2^k`` is devices ``i * 2^k .. (i + 1) * 2^k - 1``: the only
device sets a sequence-parallel step runs on, so every process group a step can need
exists before the first step (no group creation on the hot path).

The backend follows the device: ``gloo`` on CPU (a "device" is a worker process pinned to
a core), ``nccl`` on CUDA, ``hccl`` on Ascend NPUs.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


def aligned_groups(num_devices: int) -> list[tuple[int, ...]]:
    """Every aligned group of ``num_devices`` devices, smallest first (pure arithmetic).

    >>> aligned_groups(4)
    [(0,), (1,), (2,), (3,), (0, 1), (2, 3), (0, 1, 2, 3)]
    """
    if num_devices < 1:
        raise ValueError(f"aligned_groups: num_devices must be >= 1, got {num_devices}")
    out, size = [], 1
    while size <= num_devices:
        out.extend(tuple(range(i, i + size)) for i in range(0, num_devices - size + 1, size))
        size *= 2
    return out


def is_aligned(devices: tuple[int, ...], num_devices: int) -> bool:
    """Whether ``devices`` (sorted ids) is one of :func:`aligned_groups`."""
    return tuple(devices) in set(aligned_groups(num_devices))


def backend_for(device_type: str) -> str:
    """The torch.distributed backend of a device type."""
    try:
        return BACKENDS[device_type]
    except KeyError:
        raise ValueError(f"backend_for: no collective backend for device type "
                         f"{device_type!r} (known: {', '.join(BACKENDS)})") from None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for the rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_node(rank: int, num_devices: int, port: int, device_type: str = "cpu",
              timeout_s: float = 120.0) -> dict[tuple[int, ...], object]:
    """Join the node's default process group as ``rank`` and create the process group of
    every aligned group of two or more devices (every rank must call this, same
    arguments). Returns ``{devices: ProcessGroup}``."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(backend_for(device_type), rank=rank, world_size=num_devices,
                            timeout=timedelta(seconds=timeout_s))
    groups = {}
    for devices in aligned_groups(num_devices):
        if len(devices) > 1:
            # new_group is collective over the default group: every rank creates every group
            groups[devices] = (dist.group.WORLD if len(devices) == num_devices
                               else dist.new_group(list(devices)))
    _warm_peers(rank, num_devices, device_type)
    return groups


def _warm_peers(rank: int, num_devices: int, device_type: str) -> None:
    """One point-to-point exchange between every pair of ranks on the default group, with
    every rank taking part: moves are point to point there (``state_moves.reshard``), and
    a backend may set up its peer connections on the first such exchange (NCCL requires
    every rank in the first ``batch_isend_irecv`` of a group) — here, not on the hot path."""
    import torch
    import torch.distributed as dist

    if num_devices < 2:
        return
    device = torch.device("cpu") if device_type == "cpu" else torch.device(device_type, rank)
    peers = [r for r in range(num_devices) if r != rank]
    out = torch.full((1,), rank, dtype=torch.int64, device=device)
    back = {r: torch.empty(1, dtype=torch.int64, device=device) for r in peers}
    ops = [dist.P2POp(dist.isend, out, r) for r in peers]
    ops += [dist.P2POp(dist.irecv, back[r], r) for r in peers]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def close_node() -> None:
    """Leave the default process group (and with it every group) if joined."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
