#!/usr/bin/env bash
# Full `rayemb train` jobs on this machine's GPU (jobs/bench/gpu_job.py: one GPU rank on a private local Ray, the
# default config, one epoch at global batches 512 and 8192), on an offline GPU machine prepared like
# scripts/gpu_check.sh's (scripts/gpu_env.sh installs the pinned wheels from $PARTS, Ray and MLflow included).
# Usage (on the GPU machine, repo root): bash scripts/gpu_job.sh [gpu_job.py args]   (results go to $OUT when set)
set -uo pipefail
out=${OUT:-/tmp/gpu_out}; mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh" || exit $?
python3 jobs/bench/gpu_job.py --out "$out/gpu_job_$(date +%F).json" "$@" 2>&1 | tee "$out/gpu_job.log"
