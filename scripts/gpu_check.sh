#!/usr/bin/env bash
# Runs rayemb's CUDA-path tests (tests/gpu/) on an offline GPU machine whose python3 has a torch but not the
# pinned stack (docs/dev/gpu.md says why and how): scripts/gpu_env.sh installs the pinned wheels from $PARTS,
# then this runs pytest.
# Usage (on the GPU machine, repo root): bash scripts/gpu_check.sh [pytest args]   (logs go to $OUT when set)
set -uo pipefail
out=${OUT:-/tmp/gpu_out}; mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh" || exit $?
python3 - <<'PY' 2>&1 | tee "$out/versions.txt"
import torch, importlib.metadata as md
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(),
      "fbgemm_gpu", md.version("fbgemm_gpu"), "torchrec", md.version("torchrec"), "tensordict", md.version("tensordict"),
      torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
PY
python3 -m pytest tests/gpu -p no:cacheprovider -s -rA --timeout 560 "$@" 2>&1 | tee "$out/pytest.log"
