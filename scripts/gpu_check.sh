#!/usr/bin/env bash
# Runs rayemb's CUDA-path tests (tests/gpu/) on a lent GPU machine whose python3 has torch but not
# the pinned stack (docs/gpu.md). The pinned wheels travel in pieces: .whlNN/pNN (60 MiB each, cut
# from one tar of torch 2.13.0, fbgemm_gpu 1.8.0, torchrec 1.8.0, nvidia-nccl-cu13 2.29.7, tensordict,
# pyvers); this joins them, installs them into /tmp/site (--no-deps) ahead of the image's torch, and
# runs pytest. Usage: bash scripts/gpu_check.sh [pytest args]   (writes the log to $OUT when set)
set -uo pipefail
out=${OUT:-/tmp/gpu_out}; mkdir -p "$out"
if [ ! -d /tmp/site/torch ]; then
  cat .whl*/p* > /tmp/w.tar && md5sum /tmp/w.tar && mkdir -p /tmp/w && tar xf /tmp/w.tar -C /tmp/w || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    /tmp/w/*.whl /tmp/w/small/*.whl /tmp/w/nccl/*.whl || exit 4
  rm -f /tmp/w.tar
fi
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH=/tmp/site/nvidia/nccl/lib:$(find "$site/nvidia" -maxdepth 3 -type d -name lib | tr '\n' ':')${LD_LIBRARY_PATH:-}
python3 - <<'PY' 2>&1 | tee "$out/versions.txt"
import torch, fbgemm_gpu, torchrec, importlib.metadata as md
print("torch", torch.__version__, torch.version.cuda, "nccl", torch.cuda.nccl.version(), "cudnn", torch.backends.cudnn.version())
print("fbgemm_gpu", md.version("fbgemm_gpu"), "torchrec", md.version("torchrec"), "tensordict", md.version("tensordict"))
print(torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
PY
python3 -m pytest tests/gpu -p no:cacheprovider -s -rA --timeout 560 "$@" 2>&1 | tee "$out/pytest.log"
