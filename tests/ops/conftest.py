"""tests/ops: run the triton backend through its interpreter when there is no GPU.

TRITON_INTERPRET must be set before triton compiles a kernel (ditmem.ops.triton imports
triton lazily, on the first launch), so it is set here, at collection.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
