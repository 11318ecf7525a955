#!/usr/bin/env bash
# Creates .venv and installs rayemb's pinned stack from a lock (regenerate both
# with scripts/update_lock.sh): requirements/lock-gpu.txt where `nvidia-smi`
# sees a GPU, else requirements/lock-cpu.txt.
# Idempotent: a second run checks a stamp of this file, pyproject.toml and the
# lock it uses, and returns in seconds.
#
# The steps, for doing it by hand:
#   pip install -c requirements/lock-gpu.txt -e ".[gpu,test]"   # NVIDIA machine (torchrec comes with the extra)
# or, without a GPU:
#   pip install -c requirements/lock-cpu.txt -e ".[cpu,test]"
#   pip install -c requirements/lock-cpu.txt --no-deps "torchrec>=1.8,<1.9"
# On CPU torchrec goes in with --no-deps because its metadata requires the CUDA
# fbgemm-gpu, which clashes with fbgemm-gpu-cpu (see pyproject.toml).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RAYEMB_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.rayemb-install-stamp"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  EXTRA=gpu
  LOCK="$ROOT/requirements/lock-gpu.txt"
else
  EXTRA=cpu
  LOCK="$ROOT/requirements/lock-cpu.txt"
fi

want_stamp="$(cat "$ROOT/scripts/install.sh" "$ROOT/pyproject.toml" "$LOCK" | sha256sum | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" && -x "$VENV/bin/python" ]]; then
  echo "rayemb: environment up to date ($VENV)"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    echo "rayemb: needs Python 3.11 (the only version tested; the lock's numpy/pandas need >=3.11);" \
         "$PY is $("$PY" -V 2>&1 || echo missing). Set PYTHON=/path/to/python3.11." >&2
    exit 1
  fi
fi

# Reads pyproject.toml: `nodeps` prints [tool.rayemb] install-no-deps (torchrec),
# `extra NAME` prints that optional-dependency list; one requirement a line.
pyproject() {
  local py="$PY"
  [[ -x "$VENV/bin/python" ]] && py="$VENV/bin/python"
  "$py" - "$ROOT/pyproject.toml" "$@" <<'PY'
import sys, tomllib
d = tomllib.load(open(sys.argv[1], "rb"))
reqs = d["tool"]["rayemb"]["install-no-deps"] if sys.argv[2] == "nodeps" else d["project"]["optional-dependencies"][sys.argv[3]]
print("\n".join(reqs))
PY
}

EXTRA_REQS=()
if [[ "$EXTRA" == gpu ]]; then
  # The GPU lock pins torch's CUDA build and its nvidia-* runtime; the node's
  # driver must run that CUDA (the lock's header says which). `torch==X` also
  # admits X+cpu, which a CPU wheel in pip's find-links would win with: refuse it.
  echo "rayemb: NVIDIA GPU found, installing $(pyproject extra gpu | paste -sd' ') from $(basename "$LOCK")"
  torch_version="$(sed -n -E 's/^torch==([^+ ]+)$/\1/p' "$LOCK")"
  [[ -n "$torch_version" ]] || { echo "rayemb: $LOCK pins no CUDA build of torch (torch==X)" >&2; exit 1; }
  EXTRA_REQS=("torch==$torch_version,!=$torch_version+cpu")
  NODEPS=()
else
  echo "rayemb: no GPU found, installing $(pyproject extra cpu | paste -sd' ') from $(basename "$LOCK")"
  mapfile -t NODEPS < <(pyproject nodeps)
  [[ ${#NODEPS[@]} -gt 0 ]] || { echo "rayemb: cannot read [tool.rayemb] install-no-deps from pyproject.toml" >&2; exit 1; }
fi
[[ -f "$LOCK" ]] || { echo "rayemb: $LOCK is missing (bash scripts/update_lock.sh makes it)" >&2; exit 1; }

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "rayemb: creating $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# pip, setuptools and wheel at the lock's versions first: the project is then
# built with them (no build isolation, nothing fetched for the build).
"${PIP[@]}" install -q -c "$LOCK" --upgrade pip wheel setuptools
# Every dependency (torch included) resolves inside the lock's versions.
"${PIP[@]}" install -q -c "$LOCK" --no-build-isolation -e "$ROOT[$EXTRA,test]" ${EXTRA_REQS[@]+"${EXTRA_REQS[@]}"}
# CPU: torchrec's metadata requires the CUDA fbgemm-gpu, so it goes in without
# deps; its real dependencies came with the project's (pyproject.toml lists them).
if [[ ${#NODEPS[@]} -gt 0 ]]; then
  "${PIP[@]}" install -q -c "$LOCK" --no-deps "${NODEPS[@]}"
fi

"$VENV/bin/python" - <<'PY'
import torch, torchrec, fbgemm_gpu, ray, mlflow  # noqa: F401
print(f"rayemb: torch {torch.__version__}, torchrec {torchrec.__version__ if hasattr(torchrec,'__version__') else '?'}, ray {ray.__version__}, mlflow {mlflow.__version__}")
PY
echo "$want_stamp" > "$STAMP"
echo "rayemb: environment ready ($VENV)"
