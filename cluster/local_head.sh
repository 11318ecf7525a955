#!/usr/bin/env bash
# A local Ray head bound to 127.0.0.1, started and stopped by PID (never `ray stop`,
# which kills every Ray process on the machine).
#
#   cluster/local_head.sh start    # starts `ray start --head --block` in the background
#   cluster/local_head.sh stop     # signals the PID it started, waits for it to exit
#   cluster/local_head.sh status
#
# Knobs: RAY_HEAD_PORT (6379), RAY_DASHBOARD_PORT (8265), RAY_DASHBOARD_AGENT_PORT (52365),
# RAY_HEAD_NUM_CPUS (all), RAY_HEAD_EXTRA_ARGS (more `ray start` flags),
# RAYEMB_HEAD_DIR (runs/ray-head: pid file and log).
# Jobs submitted to this head run with RAYEMB_WORKSPACE=<repo>, so relative data and
# output paths in job configs resolve to this checkout, and with the repo's .venv first
# on PATH. Token auth is on (RAY_AUTH_MODE=token); clients need the same variable.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HEAD_DIR="${RAYEMB_HEAD_DIR:-$ROOT/runs/ray-head}"
PID_FILE="$HEAD_DIR/head.pid"
LOG_FILE="$HEAD_DIR/head.log"
PORT="${RAY_HEAD_PORT:-6379}"
DASH_PORT="${RAY_DASHBOARD_PORT:-8265}"
AGENT_PORT="${RAY_DASHBOARD_AGENT_PORT:-52365}"
RAY="$ROOT/.venv/bin/ray"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"

running() { [[ -f "$PID_FILE" ]] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; }

start() {
  if running; then
    echo "ray head already running (pid $(cat "$PID_FILE")), dashboard http://127.0.0.1:$DASH_PORT"
    return 0
  fi
  mkdir -p "$HEAD_DIR"
  local cpus=()
  [[ -n "${RAY_HEAD_NUM_CPUS:-}" ]] && cpus=(--num-cpus "$RAY_HEAD_NUM_CPUS")
  echo "starting ray head on 127.0.0.1:$PORT (dashboard http://127.0.0.1:$DASH_PORT), log $LOG_FILE"
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

# Ray records the newest head in /tmp/ray/ray_current_cluster and a bare `ray.init()` tries to join it;
# forget our head once it is gone (only if the record is ours).
forget_address() {
  local rec=/tmp/ray/ray_current_cluster
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

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if running; then echo "running (pid $(cat "$PID_FILE"))"; else echo "not running"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
