"""All tests: run the triton backend through its interpreter when there is no GPU.

TRITON_INTERPRET is read when triton is first imported, and other packages (diffusers,
torch) may import triton before tests/ops runs, so it is set here, before any collection.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:  # numerics over many shapes: one fixed tile each, not an autotune search per shape
    os.environ.setdefault("DITMEM_TRITON_AUTOTUNE", "0")
