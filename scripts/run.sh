#!/usr/bin/env bash
# `make run`: install if needed, generate the default synthetic data if missing, start a
# local Ray head, submit jobs/train.py with `ray job submit`, stream its logs, stop the
# head (also on failure or Ctrl-C), and say where the MLflow store is. The head's token
# (the user's RAY_AUTH_TOKEN[_PATH], else its own runs/ray-head/auth_token) and addresses come
# from `cluster/local_head.sh env`, so this works on a machine without ~/.ray/auth_token.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CONFIG="${CONFIG:-jobs/configs/synth_small.yaml}"
DATA="${DATA:-data/synth_small}"
ROWS="${ROWS:-400000}"
VENV_BIN="$ROOT/.venv/bin"

bash scripts/install.sh
if [[ ! -f "$DATA/schema.yaml" ]]; then
  "$VENV_BIN/rayemb" gen-data --out "$DATA" --rows "$ROWS"
fi

cleanup() { bash cluster/local_head.sh stop || true; }
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM
bash cluster/local_head.sh start
# RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH, RAY_ADDRESS, RAY_API_SERVER_ADDRESS of the head just started
eval "$(bash cluster/local_head.sh env)"

SUBMISSION_ID="rayemb-$(date +%Y%m%d-%H%M%S)-$$"
set +e
"$VENV_BIN/ray" job submit --address "$RAY_API_SERVER_ADDRESS" --submission-id "$SUBMISSION_ID" \
  --working-dir . -- python jobs/train.py --config "$CONFIG" "$@"
set -e
# `ray job submit` exits 0/1 only; the job's real outcome is in its status.
STATUS="$("$VENV_BIN/python" - "$SUBMISSION_ID" "$RAY_API_SERVER_ADDRESS" <<'PY'
import sys
from ray.job_submission import JobSubmissionClient
info = JobSubmissionClient(sys.argv[2]).get_job_info(sys.argv[1])
print(info.status.value if hasattr(info.status, "value") else info.status)
PY
)"
DB="$ROOT/runs/mlflow.db"
echo
echo "job $SUBMISSION_ID: $STATUS"
echo "MLflow store: sqlite:///$DB"
echo "browse it:    $VENV_BIN/mlflow ui --backend-store-uri sqlite:///$DB --host 127.0.0.1 --port 5000"
echo "              then open http://127.0.0.1:5000"
[[ "$STATUS" == "SUCCEEDED" ]]
