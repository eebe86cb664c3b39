#!/usr/bin/env bash
# Run here, on the CPU, before the GPU checks (bench/device_check.sh): the smoke's dataset and condition
# cache into .device/ (the GPU machine has neither the MiniLM package nor these library versions, so it
# cannot rebuild them) and wheels of the packages flowpost's stages import that the GPU image lacks into
# .whl/ (Python 3.12, manylinux). Both folders are ignored by git; carry them with the check.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
WS=$(mktemp -d)  # fresh: one folder per node, the current code's
trap 'rm -rf "$WS"' EXIT
$PY bench/cuda_smoke.py --workspace "$WS" --sft-steps 2 --grpo-iterations 2 --eval-samples 10
rm -rf .device && mkdir -p .device
cp -r "$WS"/acquire.digits/*/ .device/data
cp -r "$WS"/conditions.minilm/*/ .device/conditions
rm -rf .whl
$PY -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl diffusers==0.42.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection \
    webdataset braceexpand
du -sh .device .whl
