#!/usr/bin/env bash
# The step benchmark on this machine's GPU (jobs/bench/gpu.py: rayemb's step vs a hand-written DMP loop with
# batches on the GPU vs TorchRec's TrainPipelineSparseDist, global batches 512 / 8192 / 65536), on an offline GPU
# machine prepared like scripts/gpu_check.sh's (scripts/gpu_env.sh installs the pinned wheels from $PARTS).
# Usage (on the GPU machine, repo root): bash scripts/gpu_bench.sh [gpu.py args]   (results go to $OUT when set)
set -uo pipefail
out=${OUT:-/tmp/gpu_out}; mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh" || exit $?
python3 jobs/bench/gpu.py --out "$out/gpu_$(date +%F).json" "$@" 2>&1 | tee "$out/gpu_bench.log"
