#!/usr/bin/env bash
# The GPU checks as one command on a GPU machine holding a copy of this repository with .device/ and
# .whl/ from bench/device_prepare.sh: the CUDA smoke of the default pipeline (bench/cuda_smoke.py), then
# one GRPO iteration of full-size SD3.5-Medium- and FLUX.1-dev-shaped transformers
# (bench/gpu_family_iteration.py). Logs and JSON go to $OUT (default: bench-ws).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-ws}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="/tmp/site:$PWD" || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
timeout 300 python3 bench/cuda_smoke.py --workspace /tmp/ws --dataset .device/data --conditions .device/conditions \
    2>&1 | tee "$OUT/cuda_smoke.log"
timeout 420 python3 bench/gpu_family_iteration.py --workspace /tmp/ws 2>&1 | tee "$OUT/gpu_family_iteration.log"
cp /tmp/ws/*.json "$OUT/" 2>/dev/null
