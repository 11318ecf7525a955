#!/usr/bin/env bash
# Regenerates requirements/lock-cpu.txt, the constraints file that pins every
# package (transitive ones included) of rayemb's CPU environment.
#
#   bash scripts/update_lock.sh               # resolve anew in a throw-away venv
#   bash scripts/update_lock.sh --from-venv   # freeze $RAYEMB_VENV (default .venv) as it is
#
# The default mode resolves pyproject.toml's dependencies from scratch (no
# constraints, so the newest releases the pins allow) with the `cpu` and `test`
# extras plus the --no-deps packages of [tool.rayemb] install-no-deps (torchrec),
# then writes `pip freeze --all` of that venv. Run it on a machine without a GPU
# where pip finds the CPU build of torch (here: the wheel in pip's find-links;
# elsewhere add PyTorch's CPU wheel index with PIP_EXTRA_INDEX_URL): the script
# refuses a lock whose torch is not a `+cpu` build. Then run
# `bash scripts/install.sh` (its stamp hashes the lock) and the tests.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCK="$ROOT/requirements/lock-cpu.txt"
PY="${PYTHON:-python3}"
MODE=fresh
mapfile -t NODEPS < <("$PY" -c '
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["tool"]["rayemb"]["install-no-deps"]))' "$ROOT/pyproject.toml")
case "${1:-}" in
  "") ;;
  --from-venv) MODE=venv ;;
  *) echo "usage: $0 [--from-venv]" >&2; exit 2 ;;
esac

if [[ "$MODE" == venv ]]; then
  VENV="${RAYEMB_VENV:-$ROOT/.venv}"
  [[ -x "$VENV/bin/python" ]] || { echo "update_lock: no venv at $VENV (run scripts/install.sh)" >&2; exit 1; }
  HOW="pip freeze --all of an existing venv made by scripts/install.sh (scripts/update_lock.sh --from-venv)"
else
  VENV="$(mktemp -d)/venv"
  trap 'rm -rf "$(dirname "$VENV")"' EXIT
  echo "update_lock: resolving in $VENV"
  "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
  "${PIP[@]}" install -q --upgrade pip wheel setuptools
  "${PIP[@]}" install -q "$ROOT[cpu,test]"
  "${PIP[@]}" install -q --no-deps "${NODEPS[@]}"
  HOW="a fresh venv: pip install \".[cpu,test]\" (no constraints) + pip install --no-deps ${NODEPS[*]}, then pip freeze --all (scripts/update_lock.sh)"
fi

body="$("$VENV/bin/python" -m pip --disable-pip-version-check freeze --all --exclude-editable \
        | grep -v -i -E '^(rayemb([=@ ]|$)|-e )' | LC_ALL=C sort -f -t= -k1,1)"
if ! grep -q -E '^torch==[^ ]+\+cpu$' <<<"$body"; then
  echo "update_lock: torch in $VENV is not a +cpu build ($(grep -E '^torch[=@ ]' <<<"$body" || echo none)); not writing $LOCK" >&2
  exit 1
fi

mkdir -p "$(dirname "$LOCK")"
{
  echo "# Constraints for rayemb's CPU environment: every package and its exact version."
  echo "# Made on $(date -u +%Y-%m-%d) with Python $("$VENV/bin/python" -c 'import platform; print(platform.python_version())') from $HOW."
  echo "# Regenerate: bash scripts/update_lock.sh   (or --from-venv to freeze .venv)."
  echo "# Use:  pip install -c requirements/lock-cpu.txt -e \".[cpu,test]\""
  echo "#       pip install -c requirements/lock-cpu.txt --no-deps ${NODEPS[*]}"
  echo "# (scripts/install.sh does both). torch is the CPU build, 2.13.0+cpu; on a GPU"
  echo "# machine scripts/install.sh rewrites that line to take the CUDA 2.13.0 instead."
  echo "$body"
} > "$LOCK"
echo "update_lock: wrote $LOCK ($(wc -l <<<"$body") packages)"
