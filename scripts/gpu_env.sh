# Sourced by scripts/gpu_check.sh and scripts/gpu_job.sh on an offline GPU machine whose python3 has a torch but
# not the pinned stack (docs/dev/gpu.md says why and how). The pinned wheels arrive as 60 MiB pieces pNN of one tar
# (torch 2.13.0, fbgemm_gpu 1.8.0, torchrec 1.8.0, small/{tensordict, pyvers}, nccl/nvidia-nccl-cu13 2.29.7 and,
# for a full job, rt*/ with Ray, MLflow and what they need), copied into $PARTS (default /tmp/parts) beforehand.
# This joins them, installs them into /tmp/site (--no-deps, once) ahead of the machine's own torch and exports
# the environment that makes them the ones imported.
parts=${PARTS:-/tmp/parts}
if [ ! -d /tmp/site/torch ]; then
  cat "$parts"/p* > /tmp/w.tar && md5sum /tmp/w.tar && mkdir -p /tmp/w && tar xf /tmp/w.tar -C /tmp/w || return 3
  rm -f /tmp/w.tar
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    $(find /tmp/w -name '*.whl') || return 4
fi
# /tmp/site first: its torch, and its NCCL 2.29.7 (torch 2.13 links ncclCommSuspend & co., absent in NCCL 2.28)
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
# the image's CUDA 13.0 libraries (cuBLAS, cuDNN, ...) for torch 2.13 installed outside their site-packages
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH=/tmp/site/nvidia/nccl/lib:$(find "$site/nvidia" -maxdepth 3 -type d -name lib | tr '\n' ':')${LD_LIBRARY_PATH:-}
