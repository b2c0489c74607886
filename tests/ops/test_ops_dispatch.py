"""Backend selection: defaults by device, use_backend, DITMEM_OPS_BACKEND, clear errors."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import warnings

import pytest
import torch

import ditmem.ops as ops
from ditmem.ops.backends import BACKENDS, ENV_VAR


def test_available_backends_lists_every_backend_with_a_reason_or_none():
    avail = ops.available_backends()
    assert set(avail) == set(BACKENDS)
    assert avail["reference"] is None
    assert all(why is None or (isinstance(why, str) and why) for why in avail.values())


def test_cpu_tensors_default_to_the_cpu_backend(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert ops.backend_for(torch.zeros(1)) == "cpu"


def test_meta_device_falls_back_to_reference_without_warning(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ops.backend_for(torch.zeros(1, device="meta")) == "reference"


def test_use_backend_forces_and_restores(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with ops.use_backend("reference") as name:
        assert name == "reference" and ops.backend_for(torch.zeros(1)) == "reference"
        with ops.use_backend("cpu"):
            assert ops.backend_for(torch.zeros(1)) == "cpu"
        assert ops.backend_for(torch.zeros(1)) == "reference"
    assert ops.backend_for(torch.zeros(1)) == "cpu"


def test_use_backend_is_local_to_the_thread_and_task(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    seen = {}

    def other_thread():
        seen["thread"] = ops.backend_for(torch.zeros(1))

    async def task(name):
        with ops.use_backend(name):
            await asyncio.sleep(0.01)
            return ops.backend_for(torch.zeros(1))

    async def both():
        return await asyncio.gather(task("reference"), task("cpu"))

    with ops.use_backend("reference"):
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert seen["thread"] == "cpu"
    assert asyncio.run(both()) == ["reference", "cpu"]


def test_forcing_an_unavailable_backend_raises_with_the_reason(monkeypatch):
    reason = ops.available_backends()["npu"]
    assert reason is not None  # no torch_npu on this machine
    with pytest.raises(ops.BackendUnavailableError, match="npu.*unavailable"):
        with ops.use_backend("npu"):
            pass
    monkeypatch.setenv(ENV_VAR, "npu")
    with pytest.raises(ops.BackendUnavailableError, match=reason.split("(")[0][:20]):
        ops.backend_for(torch.zeros(1))


def test_unknown_backend_name_is_a_value_error(monkeypatch):
    with pytest.raises(ValueError, match="unknown ops backend 'cuda'"):
        with ops.use_backend("cuda"):
            pass
    monkeypatch.setenv(ENV_VAR, "bogus")
    with pytest.raises(ValueError, match="bogus"):
        ops.backend_for(torch.zeros(1))


def test_env_var_selects_the_backend_in_a_fresh_process():
    code = ("import torch, ditmem.ops as o; print(o.backend_for(torch.zeros(1)));"
            "from ditmem.ops.backends import backend_module as m;"
            "print(m('reference').__name__)")
    env = {"DITMEM_OPS_BACKEND": "reference", "PATH": "/usr/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["reference", "ditmem.ops.reference"]


def test_ops_run_the_selected_backend(monkeypatch):
    calls = []
    from ditmem.ops import reference

    real = reference.gather_blocks
    monkeypatch.setattr(reference, "gather_blocks",
                        lambda *a, **kw: calls.append(a) or real(*a, **kw))
    cache = torch.randn(2, 2, 3)
    table = torch.tensor([[1]], dtype=torch.int32)
    lens = torch.tensor([2], dtype=torch.int32)
    ops.gather_blocks(cache, table, lens)
    assert calls == []  # cpu backend by default
    with ops.use_backend("reference"):
        ops.gather_blocks(cache, table, lens)
    assert len(calls) == 1
