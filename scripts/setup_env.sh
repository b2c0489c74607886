#!/usr/bin/env bash
# Set up everything ditmem needs in ./.venv (idempotent): Python venv, the CPU torch pin
# when no torch is installed yet, the package in editable mode with the ditmem._C build.
# GPU users: install your CUDA/ROCm/NPU torch into .venv first; it is kept as is.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv with $($PYTHON --version)"
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade "setuptools>=70" wheel ninja 2>&1 | grep -v "is ignored" || true
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch==2.13.0 (CPU build)"
    "${PIP[@]}" install "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
fi
echo "[setup] installing ditmem (editable) and building ditmem._C"
"${PIP[@]}" install --no-build-isolation -e ".[dev,serve,triton,ray,bounds]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import ditmem, ditmem._C, ditmem.ops, ditmem.scheduler" \
    || { echo "[setup] ditmem failed to import after install" >&2; exit 1; }
echo "[setup] ok: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
