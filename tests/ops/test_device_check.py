"""The prepared device check runs end to end in its CPU dry-run mode (tiny shapes, Triton
through the interpreter), so it does not rot while no GPU is at hand."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_device_check_dry_run(tmp_path):
    out = tmp_path / "check.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/ops/device_check.py"),
                           "--dry-run", "--repeats", "2", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads(out.read_text())
    parts = {r["part"] for r in data["results"]}
    assert parts == {"attention", "copy", "overlap", "blocks", "serve"}
    assert all(r["case"] != "FAILED" for r in data["results"])
    attention = next(r for r in data["results"] if r["part"] == "attention")
    assert attention["max_abs_err"] < 1e-4
