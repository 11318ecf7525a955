#!/usr/bin/env bash
# Regenerates rayemb's two constraints files, which pin every package (transitive
# ones included) of its environments:
#   requirements/lock-cpu.txt   no GPU: torch's +cpu build, fbgemm-gpu-cpu, torchrec (--no-deps)
#   requirements/lock-gpu.txt   NVIDIA GPUs: torch's CUDA build, fbgemm-gpu, torchrec, the nvidia-* runtime
#
#   bash scripts/update_lock.sh               # both: the CPU lock resolved anew, then the GPU lock
#   bash scripts/update_lock.sh --from-venv   # the CPU lock from $RAYEMB_VENV (default .venv) as it is, then the GPU lock
#   bash scripts/update_lock.sh --gpu-only    # only the GPU lock, against the CPU lock as it is
#
# CPU lock: the default mode resolves pyproject.toml's dependencies from scratch
# (no constraints, so the newest releases the ranges allow) with the `cpu` and
# `test` extras plus the --no-deps packages of [tool.rayemb] install-no-deps
# (torchrec), then writes `pip freeze --all` of that venv. Run it on a machine
# without a GPU. torch's CPU build comes from pip's own find-links and indexes
# or from $RAYEMB_TORCH_INDEX_URL (default PyTorch's CPU wheel index
# https://download.pytorch.org/whl/cpu, added as an extra index; empty: none),
# as in scripts/install.sh: the script refuses a lock whose torch is not a
# `+cpu` build. Every pin must have wheels for Python 3.11 and 3.12, the tested
# versions (docs/dev/testing.md): check a new lock on both.
#
# GPU lock: pip's resolver, without installing anything (`pip install --dry-run
# --report`, metadata read with HTTP range requests), for the `gpu` and `test`
# extras with every package the two environments share held at its CPU-lock
# version, torch at the CPU lock's version but not its +cpu build. It resolves
# for this interpreter and platform, so run it with Python 3.11 on Linux x86_64,
# the nodes' platform. The index is $RAYEMB_GPU_INDEX_URL (default PyPI, whose
# Linux x86_64 torch wheels are the CUDA 13.0 build; PyPI's CUDA major is what
# the lock gets, and tests/unit/test_cluster_configs.py checks the cluster
# images' NVIDIA driver against it). pip's own configuration is ignored for it,
# so no local +cpu wheel can stand in for the CUDA one.
#
# Then run `bash scripts/install.sh` (its stamp hashes the locks) and the tests.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCK="$ROOT/requirements/lock-cpu.txt"
GPU_LOCK="$ROOT/requirements/lock-gpu.txt"
PY="${PYTHON:-python3}"
GPU_INDEX="${RAYEMB_GPU_INDEX_URL:-https://pypi.org/simple}"
TORCH_INDEX="${RAYEMB_TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
MODE=fresh
mapfile -t NODEPS < <("$PY" -c '
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["tool"]["rayemb"]["install-no-deps"]))' "$ROOT/pyproject.toml")
case "${1:-}" in
  "") ;;
  --from-venv) MODE=venv ;;
  --gpu-only) MODE=gpu ;;
  *) echo "usage: $0 [--from-venv | --gpu-only]" >&2; exit 2 ;;
esac

SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
sort_pins() { LC_ALL=C sort -f -t= -k1,1; }

# ---- the CPU lock ---- #
if [[ "$MODE" != gpu ]]; then
  if [[ "$MODE" == venv ]]; then
    VENV="${RAYEMB_VENV:-$ROOT/.venv}"
    [[ -x "$VENV/bin/python" ]] || { echo "update_lock: no venv at $VENV (run scripts/install.sh)" >&2; exit 1; }
    HOW="pip freeze --all of an existing venv made by scripts/install.sh (scripts/update_lock.sh --from-venv)"
  else
    VENV="$SCRATCH/cpu-venv"
    echo "update_lock: resolving the CPU environment in $VENV"
    "$PY" -m venv "$VENV"
    PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
    "${PIP[@]}" install -q --upgrade pip wheel setuptools
    # X+cpu sorts above X (a local version label): offered both, pip takes the +cpu build
    "${PIP[@]}" install -q ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} "$ROOT[cpu,test]"
    "${PIP[@]}" install -q --no-deps "${NODEPS[@]}"
    HOW="a fresh venv: pip install \".[cpu,test]\" (no constraints) + pip install --no-deps ${NODEPS[*]}, then pip freeze --all (scripts/update_lock.sh)"
  fi

  body="$("$VENV/bin/python" -m pip --disable-pip-version-check freeze --all --exclude-editable \
          | grep -v -i -E '^(rayemb([=@ ]|$)|-e )' | sort_pins)"
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
    echo "#       pip install -c requirements/lock-cpu.txt --no-deps \"${NODEPS[*]}\""
    echo "# (scripts/install.sh does both). torch is the CPU build; NVIDIA machines use"
    echo "# requirements/lock-gpu.txt, resolved against this file."
    echo "$body"
  } > "$LOCK"
  echo "update_lock: wrote $LOCK ($(wc -l <<<"$body") packages)"
fi

# ---- the GPU lock: resolved, not installed ---- #
[[ -f "$LOCK" ]] || { echo "update_lock: $LOCK is missing; run without --gpu-only first" >&2; exit 1; }
"$PY" - <<'PY' || { echo "update_lock: the GPU lock is resolved for the nodes' platform: run this with Python 3.11 on Linux x86_64" >&2; exit 1; }
import platform, sys
sys.exit(0 if sys.version_info[:2] == (3, 11) and platform.system() == "Linux" and platform.machine() == "x86_64" else 1)
PY
torch_version="$(sed -n -E 's/^torch==([^+ ]+)(\+cpu)?$/\1/p' "$LOCK")"
[[ -n "$torch_version" ]] || { echo "update_lock: $LOCK pins no torch" >&2; exit 1; }
# Everything both environments share stays at the CPU lock's version; the CPU-only builds go.
grep -v -i -E '^(torch|fbgemm[-_]gpu[-_]cpu)==' "$LOCK" > "$SCRATCH/shared.txt"
# Only what pip reads to resolve the project: its metadata, not its code.
mkdir -p "$SCRATCH/src/rayemb"
cp "$ROOT/pyproject.toml" "$ROOT/README.md" "$SCRATCH/src/"
touch "$SCRATCH/src/rayemb/__init__.py"

echo "update_lock: resolving the GPU environment against $GPU_INDEX (nothing is installed)"
GVENV="$SCRATCH/gpu-venv"
"$PY" -m venv "$GVENV"
gpip() {
  env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
    "$GVENV/bin/python" -m pip --disable-pip-version-check "$@"
}
gpip install -q --index-url "$GPU_INDEX" -c "$SCRATCH/shared.txt" --upgrade pip wheel setuptools
gpip install -q --dry-run --ignore-installed --report "$SCRATCH/report.json" --use-feature=fast-deps \
  --index-url "$GPU_INDEX" -c "$SCRATCH/shared.txt" \
  "torch==$torch_version,!=$torch_version+cpu" "$SCRATCH/src[gpu,test]" pip setuptools wheel

gpu_body="$("$PY" - "$SCRATCH/report.json" <<'PY' | sort_pins
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if name.lower() != "rayemb":
        print(f"{name}=={version}")
PY
)"
cuda="$(sed -n -E 's/^cuda-toolkit==([0-9]+\.[0-9]+).*$/\1/p' <<<"$gpu_body")"
if ! grep -q -E "^torch==$torch_version$" <<<"$gpu_body" || [[ -z "$cuda" ]]; then
  echo "update_lock: $GPU_INDEX resolved no CUDA build of torch $torch_version ($(grep -E '^(torch|cuda-toolkit)==' <<<"$gpu_body" | paste -sd' ' || echo none)); not writing $GPU_LOCK" >&2
  exit 1
fi
{
  echo "# Constraints for rayemb's NVIDIA GPU environment: every package and its exact version."
  echo "# Made on $(date -u +%Y-%m-%d) for Python 3.11 on Linux x86_64 by pip's resolver (pip install --dry-run --report,"
  echo "# nothing installed) from $GPU_INDEX: \".[gpu,test]\" with the packages shared with requirements/lock-cpu.txt"
  echo "# at its versions (scripts/update_lock.sh). Regenerate: bash scripts/update_lock.sh [--gpu-only]."
  echo "# Use:  pip install -c requirements/lock-gpu.txt -e \".[gpu,test]\"   (scripts/install.sh on a GPU machine)"
  echo "# torch $torch_version is the CUDA $cuda build: every GPU node needs an NVIDIA driver that runs CUDA $cuda."
  echo "$gpu_body"
} > "$GPU_LOCK"
echo "update_lock: wrote $GPU_LOCK ($(wc -l <<<"$gpu_body") packages, CUDA $cuda)"
