"""The ditmem._C build: portable compiler flags, and every SIMD path of the CPU kernel."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _compile_flags():
    source = (ROOT / "setup.py").read_text()
    # only the part above the build: executing setup() would start one
    namespace: dict = {"__name__": "ditmem_setup_probe"}
    exec(compile(source.split("def _extensions")[0], str(ROOT / "setup.py"), "exec"), namespace)
    return namespace["compile_flags"]


def test_flags_are_portable_unless_native_is_asked_for():
    flags = _compile_flags()
    assert not any(f.startswith("-march") for f in flags({}))
    assert not any(f.startswith("-march") for f in flags({"DITMEM_NATIVE": "0"}))
    assert "-march=native" in flags({"DITMEM_NATIVE": "1"})


def test_no_cuda_sources_are_claimed():
    source = (ROOT / "setup.py").read_text()
    assert "csrc/cuda" not in source and "CUDAExtension" not in source
    assert not list((ROOT / "csrc").glob("**/*.cu"))


_CHECK = """
import sys, torch
sys.path.insert(0, {ops!r})
import ditmem.ops as ops
from ops_factories import TOLERANCE, make_case, sdpa_reference
for dt in (torch.float32, torch.bfloat16):
    c = make_case([300, 1, 52], [1100, 3, 700], heads=8, kv_heads=2, dim=64, block_size=128,
                  dtype=dt, seed=3)
    with ops.use_backend("cpu"):
        out = ops.paged_attention(*c.args())
    torch.testing.assert_close(out.float(), sdpa_reference(c), **TOLERANCE[dt])
print("ok")
"""


@pytest.mark.parametrize("isa", ["scalar", "avx2", ""])
def test_every_simd_path_matches_sdpa(isa):
    # DITMEM_CPU_ISA caps the path picked at run time (csrc/softmax_vec.h); "" = the widest
    env = dict(os.environ, DITMEM_CPU_ISA=isa)
    code = _CHECK.format(ops=str(ROOT / "tests" / "ops"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
