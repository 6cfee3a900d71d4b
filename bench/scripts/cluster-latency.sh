#!/usr/bin/env bash
# Cross-node against same-node delivery latency on a 3-node cluster (BENCHMARKS.md):
# three release im-server nodes on the local Postgres (a fresh schema) and NATS (a fresh
# prefix); im-bench roundtrip with both users on n0 (same node) and with the b users on
# n1 (every push crosses NATS), alternated ROUNDS times, side by side.
# Usage: cargo build --release -p im-server -p im-bench && ROUNDS=3 bench/scripts/cluster-latency.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
T="${CARGO_TARGET_DIR:-target}/release"
ROUNDS="${ROUNDS:-3}"
PAIRS="${PAIRS:-50}"
DUR="${DUR:-10s}"
PG="${IM_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
NATS="${IM_TEST_NATS_URL:-nats://127.0.0.1:4222}"
ID="bench$(date +%s)"
SECRET=cluster-bench-secret-of-at-least-32-bytes
psql "$PG" -qc "CREATE SCHEMA $ID"
WORK=$(mktemp -d)
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  psql "$PG" -qc "DROP SCHEMA IF EXISTS $ID CASCADE" || true
  rm -rf "$WORK"
}
trap cleanup EXIT
for i in 0 1 2; do
  IM_DATABASE_URL="$PG?options[search_path]=$ID" IM_NATS_URL="$NATS" IM_NODE_ID="n$i" \
  IM_CLUSTER_PREFIX="$ID" IM_JWT_SECRET="$SECRET" IM_ADMIN_TOKEN=cluster-bench-admin-of-at-least-32-bytes IM_LOG=warn \
  IM_LISTEN="127.0.0.1:$((17070 + 10 * i))" IM_ADMIN_LISTEN="127.0.0.1:$((17071 + 10 * i))" \
  IM_DATA_DIR="$WORK/n$i" "$T/im-server" 2>"$WORK/n$i.log" &
  pids+=($!)
done
for i in 0 1 2; do
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$((17071 + 10 * i))/readyz" >/dev/null && break; sleep 0.1; done
done
sleep 3
run() { # $1 label, $2 peer url
  "$T/im-bench" roundtrip --url ws://127.0.0.1:17070/ws --peer-url "$2" --secret "$SECRET" \
    --pairs "$PAIRS" --duration "$DUR" --warmup 2s --no-cursor-check --json > "$WORK/$1.json"
  python3 - "$1" "$WORK/$1.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))
for k in ("send_to_ack_us", "send_to_deliver_us", "round_trip_us"):
    h = r.get(k)
    if h:
        print(f"{sys.argv[1]:<6} {k:<20} p50 {h['p50']/1000:7.2f} ms  p99 {h['p99']/1000:7.2f} ms  n {h['count']}")
print(f"{sys.argv[1]:<6} exchanges/s {r.get('exchanges_per_sec', 0):.0f}  passed {r.get('passed')}")
PY
}
for r in $(seq "$ROUNDS"); do
  echo "round $r"
  run same ws://127.0.0.1:17070/ws
  run cross ws://127.0.0.1:17080/ws
done
