"""Backend selection for ditmem.ops: which implementation runs for which inputs.

Backends: ``reference`` (pure torch, every device), ``cpu`` (C++ kernels in ditmem._C),
``triton`` (GPU, or CPU tensors under ``TRITON_INTERPRET=1``) and ``npu`` (torch_npu).
The default is chosen from the inputs' device; ``use_backend(name)`` (a context manager
backed by a ContextVar, so threads and asyncio tasks do not see each other's choice) and the
environment variable ``DITMEM_OPS_BACKEND`` force one. Forcing a backend that cannot run
raises :class:`BackendUnavailableError` with the reason.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.util
import os
import warnings
from collections.abc import Iterator
from types import ModuleType

import torch

BACKENDS = ("reference", "cpu", "triton", "npu")
ENV_VAR = "DITMEM_OPS_BACKEND"
_DEFAULT_BY_DEVICE = {"cpu": "cpu", "cuda": "triton", "npu": "npu"}
_MODULES = {
    "reference": "ditmem.ops.reference",
    "cpu": "ditmem.ops.cpu",
    "triton": "ditmem.ops.triton",
    "npu": "ditmem.ops.npu",
}

_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "ditmem_ops_backend", default=None
)


class BackendUnavailableError(RuntimeError):
    """A backend was requested (forced or needed) that cannot run here; the message says why."""


@functools.cache
def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _triton_reason() -> str | None:
    if not _installed("triton"):
        return "triton is not installed (pip install triton)"
    if torch.cuda.is_available():
        return None
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return None
    return "no CUDA device and TRITON_INTERPRET is not set to 1"


@functools.cache
def _cpu_reason() -> str | None:
    try:
        importlib.import_module("ditmem._C")
    except ImportError as exc:  # the extension was not built or does not load
        return f"ditmem._C failed to import ({exc}); rebuild with scripts/setup_env.sh"
    if not hasattr(torch.ops.ditmem, "paged_attention"):
        return "ditmem._C loaded but registers no ditmem::paged_attention kernel"
    return None


def _npu_reason() -> str | None:
    if not _installed("torch_npu"):
        return "torch_npu is not installed"
    try:
        importlib.import_module("torch_npu")
    except ImportError as exc:
        return f"torch_npu failed to import ({exc})"
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        return "torch_npu is installed but no NPU device is available"
    return None


_REASONS = {
    "reference": lambda: None,
    "cpu": _cpu_reason,
    "triton": _triton_reason,
    "npu": _npu_reason,
}


def unavailable_reason(name: str) -> str | None:
    """Why backend ``name`` cannot run in this process, or None when it can."""
    if name not in BACKENDS:
        raise ValueError(f"unknown ops backend {name!r}; expected one of {BACKENDS}")
    return _REASONS[name]()


def available_backends() -> dict[str, str | None]:
    """Every backend mapped to None (usable here) or the reason it is not usable."""
    return {name: unavailable_reason(name) for name in BACKENDS}


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[str]:
    """Force backend ``name`` for ops called inside the ``with`` block (this context only).

    Raises BackendUnavailableError at entry when the backend cannot run here.
    """
    reason = unavailable_reason(name)
    if reason is not None:
        raise BackendUnavailableError(f"ops backend {name!r} is unavailable: {reason}")
    token = _forced.set(name)
    try:
        yield name
    finally:
        _forced.reset(token)


def forced_backend() -> str | None:
    """The backend forced by use_backend() or DITMEM_OPS_BACKEND, if any (context first)."""
    name = _forced.get()
    if name is not None:
        return name
    env = os.environ.get(ENV_VAR, "").strip()
    return env or None


def backend_for(tensor: torch.Tensor) -> str:
    """Name of the backend that runs ops whose inputs live on ``tensor``'s device.

    A forced backend wins (and raises BackendUnavailableError if it cannot run). Otherwise
    cpu -> ``cpu``, cuda -> ``triton``, npu -> ``npu``, any other device -> ``reference``;
    when the device's native backend is unavailable the reference backend runs and a
    warning names the missing backend and why (never silently).
    """
    return _select(tensor.device.type)


@torch.compiler.assume_constant_result  # torch.compile: decided once, at trace time
def _select(device_type: str) -> str:
    forced = forced_backend()
    if forced is not None:
        reason = unavailable_reason(forced)
        if reason is not None:
            raise BackendUnavailableError(f"ops backend {forced!r} is unavailable: {reason}")
        return forced
    native = _DEFAULT_BY_DEVICE.get(device_type, "reference")
    reason = unavailable_reason(native)
    if reason is None:
        return native
    warnings.warn(
        f"ditmem.ops: backend {native!r} for device {device_type} is unavailable "
        f"({reason}); running the pure-torch reference backend",
        RuntimeWarning,
        stacklevel=4,
    )
    return "reference"


@functools.cache
def backend_module(name: str) -> ModuleType:
    """The module implementing backend ``name`` (imported lazily, on first use)."""
    return importlib.import_module(_MODULES[name])


# ``backend_for`` given the device type ("cpu", "cuda"...) instead of a tensor
select_backend = _select
