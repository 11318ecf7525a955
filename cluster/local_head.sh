#!/usr/bin/env bash
# A local Ray head bound to 127.0.0.1, started and stopped by PID (never `ray stop`,
# which kills every Ray process on the machine).
#
#   cluster/local_head.sh start    # starts `ray start --head --block` in the background
#   cluster/local_head.sh stop     # signals the PID it started, waits for it to exit
#   cluster/local_head.sh status
#   cluster/local_head.sh env      # shell exports a client of this head needs:
#                                  #   eval "$(bash cluster/local_head.sh env)"
#                                  #   ray job submit --working-dir . -- python jobs/train.py ...
#
# Knobs: RAY_HEAD_PORT (6379), RAY_DASHBOARD_PORT (8265), RAY_DASHBOARD_AGENT_PORT (52365),
# RAY_HEAD_NUM_CPUS (all), RAY_HEAD_EXTRA_ARGS (more `ray start` flags),
# RAYEMB_HEAD_DIR (runs/ray-head: pid file, log, auth_token, env.sh),
# RAY_TMPDIR (Ray's temp dir parent, default /tmp: sessions, sockets, ray_current_cluster).
#
# Token authentication is on (RAY_AUTH_MODE=token; RAY_AUTH_MODE=disabled turns it off).
# The token is, in this order: your RAY_AUTH_TOKEN, else the file your RAY_AUTH_TOKEN_PATH
# names (both used as they are, never written), else $RAYEMB_HEAD_DIR/auth_token — 64 random
# hex characters, created on the first start with mode 0600 and reused after. `ray start`
# does not create a token, and this script never reads or writes ~/.ray/auth_token.
# `start` also writes the client exports to $RAYEMB_HEAD_DIR/env.sh (mode 0600):
#   RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH (not printed when the token is your RAY_AUTH_TOKEN:
#   keep that set in the client's shell; its value is never written anywhere),
#   RAY_ADDRESS=127.0.0.1:<port> (GCS: `rayemb train`, ray.init, `ray status`) and
#   RAY_API_SERVER_ADDRESS=http://127.0.0.1:<dashboard port> (`ray job submit/status/logs`).
# `env` prints env.sh while the head runs, else the exports a start with the current knobs
# would write.
# Jobs submitted to this head run with RAYEMB_WORKSPACE=<repo>, so relative data and
# output paths in job configs resolve to this checkout, with the repo's .venv first on
# PATH, and with the head's RAY_AUTH_MODE and RAY_AUTH_TOKEN[_PATH] (every Ray process the
# head starts inherits its environment), so a job driver's ray.init() joins with the token.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HEAD_DIR="${RAYEMB_HEAD_DIR:-$ROOT/runs/ray-head}"
PID_FILE="$HEAD_DIR/head.pid"
LOG_FILE="$HEAD_DIR/head.log"
TOKEN_FILE="$HEAD_DIR/auth_token"
ENV_FILE="$HEAD_DIR/env.sh"
PORT="${RAY_HEAD_PORT:-6379}"
DASH_PORT="${RAY_DASHBOARD_PORT:-8265}"
AGENT_PORT="${RAY_DASHBOARD_AGENT_PORT:-52365}"
RAY="$ROOT/.venv/bin/ray"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"

running() { [[ -f "$PID_FILE" ]] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; }

abspath() { local d; d="$(cd "$(dirname "$1")" && pwd)" && echo "$d/$(basename "$1")"; }

# Sets TOKEN_PATH to the token file the head will use ("" when the token is $RAY_AUTH_TOKEN or
# auth is off). With create=1, makes $TOKEN_FILE if needed: random, mode 0600 from the start
# (umask 077), published with a no-clobber link so a concurrent start never sees it half written.
resolve_token() {
  local create="${1:-0}"
  TOKEN_PATH=""
  [[ "$RAY_AUTH_MODE" == token ]] || return 0
  [[ -n "${RAY_AUTH_TOKEN:-}" ]] && return 0
  if [[ -n "${RAY_AUTH_TOKEN_PATH:-}" ]]; then
    if [[ ! -s "$RAY_AUTH_TOKEN_PATH" || ! -r "$RAY_AUTH_TOKEN_PATH" ]]; then
      echo "RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH is not a readable, non-empty file; point it at your" \
        "token file, or unset it to use this head's own token ($TOKEN_FILE)" >&2
      return 1
    fi
    TOKEN_PATH="$(abspath "$RAY_AUTH_TOKEN_PATH")"
    return 0
  fi
  TOKEN_PATH="$TOKEN_FILE"
  [[ "$create" == 1 ]] || return 0
  if [[ ! -s "$TOKEN_FILE" ]]; then
    (
      umask 077
      tmp="$(mktemp "$TOKEN_FILE.XXXXXX")"
      trap 'rm -f "$tmp"' EXIT
      printf '%s' "$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >"$tmp"
      [[ "$(wc -c <"$tmp")" -eq 64 ]] || { echo "could not generate a token in $tmp" >&2; exit 1; }
      [[ -e "$TOKEN_FILE" && ! -s "$TOKEN_FILE" ]] && rm -f "$TOKEN_FILE"   # an empty leftover of ours
      ln "$tmp" "$TOKEN_FILE" 2>/dev/null || [[ -s "$TOKEN_FILE" ]]   # lost a race: keep the winner's
    )
    echo "created auth token $TOKEN_FILE (mode 0600)"
  fi
  chmod 600 "$TOKEN_FILE"
}

client_env() {
  echo "# client environment for the ray head of $HEAD_DIR"
  printf 'export RAY_AUTH_MODE=%q\n' "$RAY_AUTH_MODE"
  if [[ -n "$TOKEN_PATH" ]]; then
    printf 'export RAY_AUTH_TOKEN_PATH=%q\n' "$TOKEN_PATH"
  elif [[ "$RAY_AUTH_MODE" == token ]]; then
    echo "# the token is your RAY_AUTH_TOKEN: keep it set in this shell"
  fi
  printf 'export RAY_ADDRESS=%q\n' "127.0.0.1:$PORT"
  printf 'export RAY_API_SERVER_ADDRESS=%q\n' "http://127.0.0.1:$DASH_PORT"
}

start() {
  if running; then
    echo "ray head already running (pid $(cat "$PID_FILE")), dashboard http://127.0.0.1:$DASH_PORT"
    return 0
  fi
  mkdir -p "$HEAD_DIR"
  resolve_token 1
  (umask 077; client_env >"$ENV_FILE")
  local cpus=()
  [[ -n "${RAY_HEAD_NUM_CPUS:-}" ]] && cpus=(--num-cpus "$RAY_HEAD_NUM_CPUS")
  local auth=()
  [[ -n "$TOKEN_PATH" ]] && auth=(RAY_AUTH_TOKEN_PATH="$TOKEN_PATH")
  echo "starting ray head on 127.0.0.1:$PORT (dashboard http://127.0.0.1:$DASH_PORT), log $LOG_FILE"
  echo "client environment: $ENV_FILE (or: eval \"\$(bash cluster/local_head.sh env)\")"
  # RAY_ADDRESS / RAY_API_SERVER_ADDRESS from a client shell must not steer the head or its jobs.
  env -u RAY_ADDRESS -u RAY_API_SERVER_ADDRESS "${auth[@]}" \
    RAYEMB_WORKSPACE="$ROOT" PATH="$ROOT/.venv/bin:$PATH" RAY_USAGE_STATS_ENABLED=0 \
    nohup "$RAY" start --head --block --node-ip-address 127.0.0.1 --port "$PORT" \
      --dashboard-host 127.0.0.1 --dashboard-port "$DASH_PORT" --dashboard-agent-listen-port "$AGENT_PORT" \
      --disable-usage-stats "${cpus[@]}" ${RAY_HEAD_EXTRA_ARGS:-} \
      >"$LOG_FILE" 2>&1 &
  echo $! >"$PID_FILE"
  for _ in $(seq 1 120); do
    if ! running; then
      echo "ray head exited during start-up; last lines of $LOG_FILE:" >&2
      tail -n 20 "$LOG_FILE" >&2
      rm -f "$PID_FILE"
      return 1
    fi
    # ready = the dashboard answers (401 without a token is an answer) and the dashboard
    # agent, which runs submitted jobs, is healthy
    if [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$DASH_PORT/api/version" 2>/dev/null)" != 000 ]] \
       && curl -sf -o /dev/null "http://127.0.0.1:$AGENT_PORT/api/healthz" 2>/dev/null; then
      echo "ray head ready (pid $(cat "$PID_FILE"))"
      return 0
    fi
    sleep 1
  done
  echo "ray head did not become ready (dashboard :$DASH_PORT, agent :$AGENT_PORT) within 120 s; stopping it." \
    "If a port is taken (see $LOG_FILE and the session's dashboard_agent.log), set RAY_HEAD_PORT," \
    "RAY_DASHBOARD_PORT or RAY_DASHBOARD_AGENT_PORT to free ports." >&2
  stop
  return 1
}

# Ray records the newest head in $RAY_TMPDIR/ray/ray_current_cluster (RAY_TMPDIR defaults to
# TMPDIR, then /tmp) and a bare `ray.init()` tries to join it; forget our head once it is gone
# (only if the record is ours).
forget_address() {
  local rec="${RAY_TMPDIR:-${TMPDIR:-/tmp}}/ray/ray_current_cluster"
  [[ -f "$rec" ]] && grep -q ":$PORT\$" "$rec" && rm -f "$rec"
  return 0
}

stop() {
  if ! running; then
    rm -f "$PID_FILE"
    echo "ray head not running"
    return 0
  fi
  local pid
  pid="$(cat "$PID_FILE")"
  echo "stopping ray head (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$PID_FILE"; forget_address; echo "ray head stopped"; return 0; }
    sleep 1
  done
  echo "ray head (pid $pid) ignored SIGTERM for 60 s; sending SIGKILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PID_FILE"
  forget_address
}

print_env() {
  if running && [[ -f "$ENV_FILE" ]]; then
    cat "$ENV_FILE"
  else
    running || echo "# note: the ray head of $HEAD_DIR is not running" >&2
    resolve_token 0
    client_env
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if running; then echo "running (pid $(cat "$PID_FILE"))"; else echo "not running"; exit 1; fi ;;
  env) print_env ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
