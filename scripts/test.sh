#!/usr/bin/env bash
# The project's test command (README Quick start and .ci/run): set up, lint, run all tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
echo "[test] ruff"
.venv/bin/ruff check .
echo "[test] pytest"
set +e
.venv/bin/python -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "[test] pytest collected no tests: failing" >&2
    exit 1
fi
exit "$rc"
