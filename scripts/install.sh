#!/usr/bin/env bash
# Creates .venv and installs rayemb's pinned stack (DESIGN §8) from the lock,
# requirements/lock-cpu.txt (regenerate it with scripts/update_lock.sh).
# Idempotent: a second run checks a stamp of this file, pyproject.toml and the
# lock, and returns in seconds.
#
# The steps, for doing it by hand:
#   pip install -c requirements/lock-cpu.txt -e ".[cpu,test]"   # ".[gpu,test]" on an NVIDIA machine
#   pip install -c requirements/lock-cpu.txt --no-deps torchrec==1.8.0
# torchrec goes in with --no-deps because its metadata requires the CUDA
# fbgemm-gpu, which clashes with fbgemm-gpu-cpu (see pyproject.toml).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RAYEMB_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.rayemb-install-stamp"
LOCK="$ROOT/requirements/lock-cpu.txt"

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

CONSTRAINTS="$LOCK"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  EXTRA=gpu
  echo "rayemb: NVIDIA GPU found, installing CUDA $(pyproject extra gpu | paste -sd' ')"
  # The lock pins the CPU torch build (torch==X+cpu). Keep its version but refuse
  # the +cpu build, so pip takes the CUDA one (and its nvidia-* packages, which
  # the lock does not pin) even where a CPU wheel sits in pip's find-links.
  CONSTRAINTS="$(mktemp)"
  trap 'rm -f "$CONSTRAINTS"' EXIT
  sed -E 's/^torch==([^+ ]+)\+cpu$/torch==\1,!=\1+cpu/' "$LOCK" > "$CONSTRAINTS"
else
  EXTRA=cpu
  echo "rayemb: no GPU found, installing $(pyproject extra cpu | paste -sd' ')"
fi
mapfile -t NODEPS < <(pyproject nodeps)
[[ ${#NODEPS[@]} -gt 0 ]] || { echo "rayemb: cannot read [tool.rayemb] install-no-deps from pyproject.toml" >&2; exit 1; }

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "rayemb: creating $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# pip, setuptools and wheel at the lock's versions first: the project is then
# built with them (no build isolation, nothing fetched for the build).
"${PIP[@]}" install -q -c "$CONSTRAINTS" --upgrade pip wheel setuptools
# Every dependency (torch included) resolves inside the lock's versions.
"${PIP[@]}" install -q -c "$CONSTRAINTS" --no-build-isolation -e "$ROOT[$EXTRA,test]"
# torchrec's metadata requires the CUDA fbgemm-gpu: install it without deps; its
# real dependencies came with the project's (pyproject.toml lists them).
"${PIP[@]}" install -q -c "$CONSTRAINTS" --no-deps "${NODEPS[@]}"

"$VENV/bin/python" - <<'PY'
import torch, torchrec, fbgemm_gpu, ray, mlflow  # noqa: F401
print(f"rayemb: torch {torch.__version__}, torchrec {torchrec.__version__ if hasattr(torchrec,'__version__') else '?'}, ray {ray.__version__}, mlflow {mlflow.__version__}")
PY
echo "$want_stamp" > "$STAMP"
echo "rayemb: environment ready ($VENV)"
