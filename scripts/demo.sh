#!/usr/bin/env bash
# The main job (README Quick start): set up, then run `ditmem demo` with any extra flags.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/ditmem demo "$@"
