#!/usr/bin/env bash
# The GPU check in one command, on a Linux machine with one NVIDIA GPU, CUDA JAX, PyTorch and transformers,
# and no package registry (benchmarks/gpu/README.md):
#
#     bash benchmarks/gpu/run.sh OUT_DIR [gpu_check.py options]
#
# Installs the wheels carried in benchmarks/gpu/wheels/ (`make gpu-wheels`) into a folder of their own
# (never over the image's packages), then runs `python -m benchmarks.gpu.gpu_check` with the image's Python,
# for the server too: by default the 4B stage (sampling breakdown, RL step split, fused vs 2-pass) and then
# the 1.7B's breakdown at batch 64, within a 530 s budget for starting phases (`--plan` prints it).
# Its output also goes to OUT_DIR/gpu-check.log. Environment: GPU_CHECK_PYTHON (default python3),
# GPU_CHECK_SITE (default /tmp/site: where the wheels go), GPU_CHECK_PATH (more PYTHONPATH entries after
# it, for the CPU stand-in of the image, README.md).
set -euo pipefail
out=${1:?usage: bash benchmarks/gpu/run.sh OUT_DIR [gpu_check.py options]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
python=${GPU_CHECK_PYTHON:-python3}
site=${GPU_CHECK_SITE:-/tmp/site}
wheels=benchmarks/gpu/wheels
start=$(date +%s)

ls $wheels/*.whl >/dev/null 2>&1 || { echo "gpu-check: no wheels in $wheels: run \`make gpu-wheels\` first" >&2; exit 2; }
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" $wheels/*.whl
export PYTHONPATH="$site:$PWD${GPU_CHECK_PATH:+:$GPU_CHECK_PATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # nothing outside the machine: never wait on the hub
# skyrl[jax] asks flax >= 0.12.10: an older flax in the image gives way to the carried one
if ! "$python" -c 'import sys, flax; sys.exit(tuple(map(int, flax.__version__.split(".")[:3])) < (0, 12, 10))'; then
    echo "gpu-check: the image's flax is older than 0.12.10; installing the carried one"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        $wheels/fallback/*.whl
fi
# The lock's jax (0.12) where someone brought its CUDA wheels (jax, jaxlib, the plugin for the image's CUDA)
# in wheels/jax/: they go in front of the image's; `make gpu-wheels` never fetches them (README.md says why)
if ls $wheels/jax/*.whl >/dev/null 2>&1; then
    echo "gpu-check: installing the jax wheels of $wheels/jax/ in front of the image's jax"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        $wheels/jax/*.whl
fi
echo "gpu-check: wheels installed in $(( $(date +%s) - start ))s"
set -o pipefail
"$python" -m benchmarks.gpu.gpu_check --out "$out" --python "$python" "$@" 2>&1 | tee "$out/gpu-check.log"
