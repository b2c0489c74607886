"""ditmem: paged memory, ragged paged attention and an SLO-aware step scheduler for
serving diffusion transformers (Qwen-Image, Wan2.2).

torch is imported first because the ditmem._C extension links against its libraries.
"""

import torch  # noqa: F401  (must precede any import of ditmem._C)

__version__ = "0.1.0"


def patch(model):
    """Patch a diffusers DiT (or a pipeline holding one) with ditmem attention.

    See :func:`ditmem.models.patch`.
    """
    from ditmem.models import patch as _patch

    return _patch(model)
