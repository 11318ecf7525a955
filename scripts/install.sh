#!/usr/bin/env bash
# Creates .venv and installs rayemb's pinned stack from a lock (regenerate both
# with scripts/update_lock.sh): requirements/lock-gpu.txt where `nvidia-smi`
# sees a GPU, else requirements/lock-cpu.txt. Python 3.11 or 3.12 ($PYTHON,
# default python3).
# Idempotent: a second run checks a stamp of this file, pyproject.toml and the
# lock it uses, and returns in seconds.
#
#   bash scripts/install.sh             # install (or find the venv up to date)
#   bash scripts/install.sh --dry-run   # say which lock, and where pip gets torch from; install nothing
#
# The CPU lock pins torch's +cpu build, which PyPI does not serve: PyTorch's CPU
# wheel index does. When pip, as configured (find-links, index-url,
# extra-index-url: a local wheel works offline), finds no such wheel for this
# Python, the install adds $RAYEMB_TORCH_INDEX_URL (default
# https://download.pytorch.org/whl/cpu) as an extra index; set it to a mirror,
# or to the empty string to never add one. Exit code 3: no +cpu torch wheel for
# this Python anywhere pip may look (the venv has neither torch nor rayemb).
#
# The steps, for doing it by hand:
#   pip install -c requirements/lock-gpu.txt -e ".[gpu,test]"   # NVIDIA machine (torchrec comes with the extra)
# or, without a GPU:
#   pip install -c requirements/lock-cpu.txt -e ".[cpu,test]" --extra-index-url https://download.pytorch.org/whl/cpu
#   pip install -c requirements/lock-cpu.txt --no-deps "torchrec>=1.8,<1.9"
# On CPU torchrec goes in with --no-deps because its metadata requires the CUDA
# fbgemm-gpu, which clashes with fbgemm-gpu-cpu (see pyproject.toml).
set -euo pipefail

DRY_RUN=0
case "${1:-}" in
  "") ;;
  --dry-run) DRY_RUN=1 ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RAYEMB_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.rayemb-install-stamp"
DEFAULT_TORCH_INDEX=https://download.pytorch.org/whl/cpu
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  EXTRA=gpu
  LOCK="$ROOT/requirements/lock-gpu.txt"
else
  EXTRA=cpu
  LOCK="$ROOT/requirements/lock-cpu.txt"
fi

want_stamp="$(cat "$ROOT/scripts/install.sh" "$ROOT/pyproject.toml" "$LOCK" | sha256sum | cut -d' ' -f1)"
if [[ $DRY_RUN == 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" && -x "$VENV/bin/python" ]]; then
  echo "rayemb: environment up to date ($VENV)"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3, 11), (3, 12)))' 2>/dev/null; then
    echo "rayemb: needs Python 3.11 or 3.12 (the versions tested; every pin of the locks has wheels for both);" \
         "$PY is $("$PY" -V 2>&1 || echo missing). Set PYTHON=/path/to/python3.12 (or 3.11)." >&2
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

# pip_has PYTHON NAME VERSION [PIP OPTION...]: pip, as configured plus the options, finds a
# wheel of NAME==VERSION for that interpreter. Reads index pages and find-links, downloads
# nothing; an unreachable index counts as not having it.
pip_has() {
  local py="$1" name="$2" version="$3"
  shift 3
  "$py" -m pip --disable-pip-version-check --timeout 20 --retries 1 index versions "$name" "$@" 2>/dev/null \
    | sed -n 's/^Available versions: //p' | tr ',' '\n' | tr -d ' ' | grep -qxF "$version"
}

# torch_index_args PYTHON: the pip options that get the CPU lock's torch build, one a line
# (none when pip finds it as configured); exits 3 when nothing pip may use serves it.
torch_index_args() {
  local py="$1" torch_pin index pyver
  torch_pin="$(sed -n -E 's/^torch==([^ ]+\+cpu)$/\1/p' "$LOCK")"
  [[ -n "$torch_pin" ]] || { echo "rayemb: $LOCK pins no +cpu build of torch (torch==X+cpu)" >&2; exit 1; }
  pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if pip_has "$py" torch "$torch_pin"; then
    echo "rayemb: torch==$torch_pin for Python $pyver: pip finds it as configured (no extra index)" >&2
    return 0
  fi
  index="${RAYEMB_TORCH_INDEX_URL-$DEFAULT_TORCH_INDEX}"
  if [[ -z "$index" ]]; then
    echo "rayemb: pip finds no torch==$torch_pin wheel for Python $pyver (find-links, index-url, extra-index-url)" \
         "and RAYEMB_TORCH_INDEX_URL is empty, so no index is added: put the wheel in pip's find-links, or unset" \
         "RAYEMB_TORCH_INDEX_URL (PyTorch's CPU wheel index, $DEFAULT_TORCH_INDEX) or set it to a mirror of it." >&2
    exit 3
  fi
  if ! pip_has "$py" torch "$torch_pin" --extra-index-url "$index"; then
    echo "rayemb: no torch==$torch_pin wheel for Python $pyver on $(uname -m): not in pip's find-links or indexes," \
         "nor at RAYEMB_TORCH_INDEX_URL=$index (unreachable, or without that build): set RAYEMB_TORCH_INDEX_URL" \
         "to an index that serves it, or put the wheel in pip's find-links." >&2
    exit 3
  fi
  echo "rayemb: torch==$torch_pin for Python $pyver: from the extra index $index" >&2
  printf '%s\n' --extra-index-url "$index"
}

if [[ $DRY_RUN == 1 ]]; then
  py="$PY"
  [[ -x "$VENV/bin/python" ]] && py="$VENV/bin/python"
  echo "rayemb: would install into $VENV with $("$py" -V 2>&1) from $(basename "$LOCK")"
  if [[ "$EXTRA" == cpu ]]; then
    torch_index_args "$py" > /dev/null
  fi
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "rayemb: creating $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# pip, setuptools and wheel at the lock's versions first: the project is then
# built with them (no build isolation, nothing fetched for the build).
"${PIP[@]}" install -q -c "$LOCK" --upgrade pip wheel setuptools
INDEX_ARGS=()
if [[ "$EXTRA" == cpu ]]; then
  index_args="$(torch_index_args "$VENV/bin/python")"
  [[ -n "$index_args" ]] && mapfile -t INDEX_ARGS <<<"$index_args"
fi
# Every dependency (torch included) resolves inside the lock's versions.
"${PIP[@]}" install -q -c "$LOCK" ${INDEX_ARGS[@]+"${INDEX_ARGS[@]}"} --no-build-isolation -e "$ROOT[$EXTRA,test]" \
  ${EXTRA_REQS[@]+"${EXTRA_REQS[@]}"}
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
