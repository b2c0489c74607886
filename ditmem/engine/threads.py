"""CPU thread count for the engine's torch work.

On a CPU the engine runs one stage at a time on its own thread; torch's intra-op pool adds
little for the tiny models and, when the machine is shared (more runnable threads than
cores), its OpenMP workers wait on each other: measured on the 2-core development machine
under load, a 64x64 tiny-qwen step took 55 ms median (720 ms max) with 2 threads and 8 ms
with 1. So ``--threads`` defaults to 1; raise it on a dedicated multi-core host.
"""

from __future__ import annotations


def set_torch_threads(n: int | None) -> None:
    """``torch.set_num_threads(n)`` when ``n`` is given (>= 1)."""
    if n is None:
        return
    if n < 1:
        raise ValueError(f"threads: must be >= 1, got {n}")
    import torch

    torch.set_num_threads(n)


def add_threads_argument(p) -> None:
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads on CPU (default 1; see ditmem.engine.threads)")
