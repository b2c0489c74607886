"""All tests: run the triton backend through its interpreter when there is no GPU.

TRITON_INTERPRET is read when triton is first imported, and other packages (diffusers,
torch) may import triton before tests/ops runs, so it is set here, before any collection.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# CI (``CI`` set, as on the landing machine) draws the same examples every run, so a
# landing cannot fail on a case no one has seen; local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:  # numerics over many shapes: one fixed tile each, not an autotune search per shape
    os.environ.setdefault("DITMEM_TRITON_AUTOTUNE", "0")


_BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="session")
def load_benchmark():
    """``load_benchmark("parallel/noise_fit.py")``: a script under benchmarks/ as a module (the
    scripts are no package); its folder goes on ``sys.path`` first, for its sibling imports."""

    def load(path: str):
        file = _BENCHMARKS / path
        if str(file.parent) not in sys.path:
            sys.path.insert(0, str(file.parent))
        spec = importlib.util.spec_from_file_location(file.stem, file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
