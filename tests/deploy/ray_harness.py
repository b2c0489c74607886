"""Helpers of the deploy tests: the application on a local Ray cluster
(:func:`ditmem.deploy.local.local_apps`), Prometheus samples, PNG decoding."""

from __future__ import annotations

import base64
import contextlib
import io
import re

import numpy as np


@contextlib.contextmanager
def ray_app(engine_config, options, *, num_cpus: float = 2, timeout_s: float = 240.0):
    """Yields the HTTP base URL of one application at ``/``."""
    from ditmem.deploy.local import local_apps

    with local_apps({"/": (engine_config, options)}, num_cpus=num_cpus,
                    timeout_s=timeout_s) as url:
        yield url


def metric(text: str, name: str, **labels) -> float:
    """The value of one sample of ``name`` with exactly these labels (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if got == {k: str(v) for k, v in labels.items()}:
            return float(m.group(3))
    return 0.0


def png(b64: str) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))
