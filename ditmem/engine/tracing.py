"""NVTX ranges around engine stages (encode / step / decode / offload / restore).

When the ``nvtx`` package is installed, :func:`stage_range` opens a named range that shows in
Nsight Systems; otherwise it is a no-op context manager. Nothing is raised either way.
"""

from __future__ import annotations

import contextlib
import importlib.util

NVTX_AVAILABLE = importlib.util.find_spec("nvtx") is not None

COLORS = {"encode": "blue", "step": "green", "decode": "purple", "offload": "orange",
          "restore": "yellow"}


def stage_range(stage: str, detail: str = ""):
    """Context manager for one engine stage; ``detail`` is appended to the range name."""
    if not NVTX_AVAILABLE:
        return contextlib.nullcontext()
    import nvtx

    name = f"ditmem.{stage}" + (f" {detail}" if detail else "")
    return nvtx.annotate(name, color=COLORS.get(stage, "white"), domain="ditmem")
