#!/usr/bin/env bash
# An emulated multi-node Ray cluster on this machine (network namespaces, shaped links); needs root.
#   cluster/emulate.sh up --nodes 2 --cpus-per-node 1 --bandwidth-mbit 100 [--latency-ms 1] [--name NAME]
#   cluster/emulate.sh exec -- python jobs/train.py --config jobs/configs/criteo_synth.yaml
#   cluster/emulate.sh status | env | down
# See cluster/emulate.py and docs/cluster.md.
exec "$(dirname "$0")/../.venv/bin/python" "$(dirname "$0")/emulate.py" "$@"
