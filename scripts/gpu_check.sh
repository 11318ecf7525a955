#!/usr/bin/env bash
# Runs rayemb's CUDA-path tests (tests/gpu/) on an offline GPU machine whose python3 has a torch but not the
# pinned stack (docs/gpu.md says why and how). The pinned wheels arrive as 60 MiB pieces pNN of one tar
# (torch 2.13.0, fbgemm_gpu 1.8.0, torchrec 1.8.0, small/{tensordict 0.15.3, pyvers 0.2.3},
# nccl/nvidia-nccl-cu13 2.29.7), copied into $PARTS (default /tmp/parts) beforehand. This joins them,
# installs them into /tmp/site (--no-deps, once) ahead of the machine's own torch and runs pytest.
# Usage (on the GPU machine, repo root): bash scripts/gpu_check.sh [pytest args]   (logs go to $OUT when set)
set -uo pipefail
out=${OUT:-/tmp/gpu_out}; mkdir -p "$out"
parts=${PARTS:-/tmp/parts}
if [ ! -d /tmp/site/torch ]; then
  cat "$parts"/p* > /tmp/w.tar && md5sum /tmp/w.tar && mkdir -p /tmp/w && tar xf /tmp/w.tar -C /tmp/w || exit 3
  rm -f /tmp/w.tar
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    /tmp/w/*.whl /tmp/w/small/*.whl /tmp/w/nccl/*.whl || exit 4
fi
# /tmp/site first: its torch, and its NCCL 2.29.7 (torch 2.13 links ncclCommSuspend & co., absent in the image's 2.28.9)
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1
# the image's CUDA 13.0 libraries (cuBLAS, cuDNN 9.19, ...) for torch 2.13 installed outside their site-packages
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH=/tmp/site/nvidia/nccl/lib:$(find "$site/nvidia" -maxdepth 3 -type d -name lib | tr '\n' ':')${LD_LIBRARY_PATH:-}
python3 - <<'PY' 2>&1 | tee "$out/versions.txt"
import torch, importlib.metadata as md
print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(),
      "fbgemm_gpu", md.version("fbgemm_gpu"), "torchrec", md.version("torchrec"), "tensordict", md.version("tensordict"),
      torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
PY
python3 -m pytest tests/gpu -p no:cacheprovider -s -rA --timeout 560 "$@" 2>&1 | tee "$out/pytest.log"
