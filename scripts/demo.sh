#!/usr/bin/env bash
# The main job (README Quick start): set up, then run the two-device demo
# (`ditmem demo --devices 2`: fifo on two static replicas vs slo with elastic degree and
# migration) — the one-device demo on a one-core machine; a --devices given is passed on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
args=("$@")
if [[ " $* " != *" --devices"* ]] && [ "$(nproc)" -ge 2 ]; then
  args=(--devices 2 "${args[@]}")
fi
exec .venv/bin/ditmem demo "${args[@]}"
