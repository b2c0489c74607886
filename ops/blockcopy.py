"""Block copies with plain torch: coalesced runs of consecutive blocks, any devices.

Used by the backends for copies the C++ kernel does not cover (GPU/NPU memory, and
host<->device transfers). Host<->device copies are issued with ``non_blocking=True`` when
the host side is pinned, so they overlap with compute on the current stream.
"""

from __future__ import annotations

import torch


def runs(mapping: torch.Tensor) -> list[tuple[int, int, int]]:
    """Split an int [N, 2] (src, dst) mapping into (src_start, dst_start, length) runs
    where both src and dst ids increase by one."""
    pairs = mapping.tolist()
    out: list[tuple[int, int, int]] = []
    for s, d in pairs:
        if out and s == out[-1][0] + out[-1][2] and d == out[-1][1] + out[-1][2]:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
        else:
            out.append((s, d, 1))
    return out


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, mapping: torch.Tensor) -> None:
    """dst[mapping[i, 1]] = src[mapping[i, 0]] for every i; src/dst: [num_blocks, *block]."""
    if mapping.shape[0] == 0:
        return
    if src.device == dst.device and mapping.shape[0] > 8:
        m = mapping.to(src.device, torch.int64)
        dst.index_copy_(0, m[:, 1], src.index_select(0, m[:, 0]))
        return
    pinned = (src.device.type == "cpu" and src.is_pinned()) or (
        dst.device.type == "cpu" and dst.is_pinned()
    )
    for s, d, n in runs(mapping):
        dst[d : d + n].copy_(src[s : s + n], non_blocking=pinned)
