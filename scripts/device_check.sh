#!/usr/bin/env bash
# The prepared device check (<= 8 minutes on one H200): the test suite on CUDA, then
# benchmarks/ops/device_check.py (attention vs flash-attn/SDPA, copies vs raw memcpy, overlap,
# a real-dimension Qwen-Image block stack vs the h200 profile, a short serving run), and with
# 2+ GPUs a decode split across two of them (benchmarks/parallel/split_decode_check.py).
# Results: $OUT (default ./device_check) /device_check.json and .txt, pytest.log,
# split_decode.json and .txt.
#   bash scripts/device_check.sh            # on a CUDA machine
#   bash scripts/device_check.sh --dry-run  # anywhere: tiny shapes on the CPU, no test suite
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./device_check}
mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
status=0
if [[ "${1:-}" != "--dry-run" ]]; then
    timeout 300 "$PY" -m pytest -q -x -p no:cacheprovider tests/ops tests/memory \
        tests/models/test_host_reads.py tests/models/common/test_dtype.py \
        tests/engine/test_engine_overlap.py tests/tools/test_profile_stats.py \
        > "$OUT/pytest.log" 2>&1 || status=1
    tail -3 "$OUT/pytest.log"
fi
timeout 420 "$PY" benchmarks/ops/device_check.py "$@" --json "$OUT/device_check.json" \
    | tee "$OUT/device_check.txt" || status=1
# A decode split across 2 GPUs (benchmarks/parallel/split_decode_check.py: bits vs the
# one-GPU tiled decode, seconds, pages left), only where the machine has 2 or more.
if [[ "${1:-}" != "--dry-run" ]]; then
    gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
    if (( gpus >= 2 )); then
        timeout 240 "$PY" benchmarks/parallel/split_decode_check.py --device cuda \
            --json "$OUT/split_decode.json" 2>&1 | tee "$OUT/split_decode.txt" || status=1
    else
        echo "split decode across 2 devices: skipped: $gpus GPU" | tee "$OUT/split_decode.txt"
    fi
fi
exit $status
