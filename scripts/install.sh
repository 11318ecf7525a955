#!/usr/bin/env bash
# Creates .venv and installs rayemb's pinned stack (DESIGN §8). Idempotent:
# a second run checks a stamp of this file's contents and returns in seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RAYEMB_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.rayemb-install-stamp"

TORCH_VERSION=2.13.0
FBGEMM_VERSION=1.8.0
TORCHREC_VERSION=1.8.0
RAY_VERSION=2.60.0
MLFLOW_SPEC="mlflow>=3.17,<3.18"

want_stamp="$(cat "$ROOT/scripts/install.sh" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" && -x "$VENV/bin/python" ]]; then
  echo "rayemb: environment up to date ($VENV)"
  exit 0
fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  FBGEMM_PKG="fbgemm-gpu==$FBGEMM_VERSION"
  echo "rayemb: NVIDIA GPU found, installing CUDA $FBGEMM_PKG"
else
  FBGEMM_PKG="fbgemm-gpu-cpu==$FBGEMM_VERSION"
  echo "rayemb: no GPU found, installing $FBGEMM_PKG"
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "rayemb: creating $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

"${PIP[@]}" install -q --upgrade pip wheel setuptools
# torch first and pinned, so that nothing later pulls a different (CUDA) build.
"${PIP[@]}" install -q "torch==$TORCH_VERSION"
"${PIP[@]}" install -q "torch==$TORCH_VERSION" "$FBGEMM_PKG"
# torchrec's metadata requires the CUDA fbgemm-gpu: install it without deps and
# add its real dependencies by hand.
"${PIP[@]}" install -q --no-deps "torchrec==$TORCHREC_VERSION"
"${PIP[@]}" install -q "torch==$TORCH_VERSION" tensordict "torchmetrics==1.0.3" tqdm pyre-extensions iopath
"${PIP[@]}" install -q "torch==$TORCH_VERSION" "ray[default,train]==$RAY_VERSION" "$MLFLOW_SPEC" pyarrow pandas pyyaml matplotlib scikit-learn
"${PIP[@]}" install -q --no-deps -e "$ROOT"
"${PIP[@]}" install -q pytest pytest-timeout

"$VENV/bin/python" - <<'PY'
import torch, torchrec, fbgemm_gpu, ray, mlflow  # noqa: F401
print(f"rayemb: torch {torch.__version__}, torchrec {torchrec.__version__ if hasattr(torchrec,'__version__') else '?'}, ray {ray.__version__}, mlflow {mlflow.__version__}")
PY
echo "$want_stamp" > "$STAMP"
echo "rayemb: environment ready ($VENV)"
