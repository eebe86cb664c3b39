#!/usr/bin/env bash
# The GPU checks on a GPU machine holding a copy of this repository with .device/ and .whl/ from
# bench/device_prepare.sh, one part per command (each fits a 10-minute call):
#   bench/device_check.sh smoke          # the default pipeline's stages and evaluation (bench/cuda_smoke.py)
#   bench/device_check.sh family sd3     # a GRPO iteration of a full-size SD3.5-Medium-shaped transformer
#   bench/device_check.sh family flux1   # the same for FLUX.1-dev (bench/gpu_family_iteration.py)
#   bench/device_check.sh precision sd3  # bf16 replay ratio and lr-1e-5 LoRA updates at full depth
#                                        # (bench/precision_check.py; also flux1)
# Logs and JSON go to $OUT (default: bench-ws); the exit status is the check's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-ws}
PART=${1:-smoke}
mkdir -p "$OUT"
rm -rf /tmp/ws
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" DO_NOT_TRACK=1 HF_HUB_OFFLINE=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
case "$PART" in
    smoke)
        timeout 540 python3 bench/cuda_smoke.py --workspace /tmp/ws --dataset .device/data \
            --conditions .device/conditions 2>&1 | tee "$OUT/cuda_smoke.log"
        status=$? ;;
    family)
        timeout 540 python3 bench/gpu_family_iteration.py --workspace /tmp/ws --families "${2:?family sd3|flux1}" \
            2>&1 | tee "$OUT/gpu_family_iteration-$2.log"
        status=$? ;;
    precision)
        timeout 540 python3 bench/precision_check.py --workspace /tmp/ws --families "${2:?family sd3|flux1}" \
            2>&1 | tee "$OUT/precision_check-$2.log"
        status=$? ;;
    *)
        echo "unknown part '$PART': give smoke, family sd3|flux1 or precision sd3|flux1" >&2
        exit 2 ;;
esac
cp /tmp/ws/*.json "$OUT/" 2>/dev/null
exit "$status"
