#!/usr/bin/env bash
# 50,000 idle connections the way a deployment holds them (BENCHMARKS.md, idle section):
# one process may open 20,000 descriptors here, so three release im-server nodes in
# cluster mode (the local Postgres with a fresh schema, the local NATS with a fresh
# prefix) hold PER_NODE idle connections each, driven by one `im-bench idle` per node,
# all ramping at the same time. Once every node holds its share, the script reads each
# node's /admin/v1/overview and /admin/v1/memory and prints per node and in total:
# connections, RSS, (RSS at N - RSS at 0) / N, heap (jemalloc allocated) per connection,
# the node's own per-connection estimate and its headroom. Then it stops the generators
# and the nodes, drops the schema and deletes the NATS KV buckets it created.
# Usage: cargo build --release -p im-server -p im-bench && bench/scripts/idle-50k.sh
#   env: NODES (3), PER_NODE (16700), RAMP (60s, in seconds), HOLD (30s), SEND_PROB (0.02),
#        BASE_PORT (27070: node i listens on BASE_PORT+10i, admin on BASE_PORT+10i+1),
#        IM_TEST_DATABASE_URL, IM_TEST_NATS_URL, OUT (a directory to keep the JSON in).
set -euo pipefail
cd "$(dirname "$0")/../.."
T="${CARGO_TARGET_DIR:-target}/release"
NODES="${NODES:-3}"
PER_NODE="${PER_NODE:-16700}"
RAMP="${RAMP:-60s}"
HOLD="${HOLD:-30s}"
SEND_PROB="${SEND_PROB:-0.02}"
BASE_PORT="${BASE_PORT:-27070}"
PG="${IM_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
NATS="${IM_TEST_NATS_URL:-nats://127.0.0.1:4222}"
ID="idle50k$(date +%s)"
SECRET=idle-50k-secret-of-at-least-32-bytes
TOKEN=idle-50k-admin-of-at-least-32-bytes
# The load stays bounded: at most 51,000 connections in all, at most 19,000 per process.
if (( NODES * PER_NODE > 51000 || PER_NODE > 19000 )); then
  echo "idle-50k: $NODES x $PER_NODE connections is over the bound (51,000 total, 19,000 per process)" >&2
  exit 2
fi
source bench/scripts/cluster-lib.sh
cluster_preflight "$T" "$NODES" "$BASE_PORT"

WORK=$(mktemp -d)
OUT="${OUT:-$WORK}"
mkdir -p "$OUT"
node_pids=()
gen_pids=()
cleanup() {
  cluster_teardown "$PG" "$ID" "$NATS" "${gen_pids[@]}" "${node_pids[@]}"
  [[ "$OUT" == "$WORK" ]] || cp "$WORK"/n*.log "$OUT"/ 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
psql "$PG" -qc "CREATE SCHEMA $ID"

start_nodes
# The sampler reads RSS once a second: let the nodes settle, then take the baselines.
sleep 5
read_node() { # node, label
  curl -sf -H "Authorization: Bearer $TOKEN" "$(admin "$1")/admin/v1/overview" >"$OUT/n$1.$2.overview.json"
  curl -sf -H "Authorization: Bearer $TOKEN" "$(admin "$1")/admin/v1/memory" >"$OUT/n$1.$2.memory.json"
}
for i in $(seq 0 $((NODES - 1))); do read_node "$i" base; done

echo "idle-50k: $NODES nodes x $PER_NODE idle connections, ramp $RAMP, hold $HOLD (schema and prefix $ID)"
start=$(date +%s)
for i in $(seq 0 $((NODES - 1))); do
  "$T/im-bench" idle --url "ws://127.0.0.1:$((BASE_PORT + 10 * i))/ws" --admin-url "$(admin "$i")" \
    --admin-token "$TOKEN" --secret "$SECRET" --connections "$PER_NODE" --ramp "$RAMP" \
    --duration "$HOLD" --send-prob "$SEND_PROB" --json >"$OUT/gen$i.json" 2>"$WORK/gen$i.err" &
  gen_pids+=($!)
done

# Wait until every node holds its share (or a generator gave up), then read every node.
ramp_secs=600
[[ "$RAMP" =~ ^([0-9]+)s$ ]] && ramp_secs=${BASH_REMATCH[1]}
deadline=$((start + ramp_secs + 120))
while :; do
  full=0
  counts=""
  for i in $(seq 0 $((NODES - 1))); do
    c=$(curl -sf -H "Authorization: Bearer $TOKEN" "$(admin "$i")/admin/v1/overview" | jq -r '.connections' || echo 0)
    counts+=" n$i=$c"
    (( c >= PER_NODE )) && full=$((full + 1))
  done
  echo "idle-50k: $(( $(date +%s) - start ))s:$counts"
  (( full == NODES )) && break
  for p in "${gen_pids[@]}"; do
    kill -0 "$p" 2>/dev/null || { echo "idle-50k: a generator ended before every node was full" >&2; tail -5 "$WORK"/gen*.err >&2; exit 1; }
  done
  (( $(date +%s) < deadline )) || { echo "idle-50k: the nodes were not full in time" >&2; exit 1; }
  sleep 5
done
sleep 5
for i in $(seq 0 $((NODES - 1))); do read_node "$i" full; done
echo "idle-50k: read all nodes at $(( $(date +%s) - start ))s; waiting for the generators' hold to end"

rc=0
for i in "${!gen_pids[@]}"; do
  wait "${gen_pids[$i]}" || { echo "idle-50k: generator $i failed" >&2; tail -20 "$WORK/gen$i.err" >&2; rc=1; }
done
gen_pids=()

python3 - "$OUT" "$NODES" <<'PY'
import json, sys
out, nodes = sys.argv[1], int(sys.argv[2])
def load(path):
    with open(path) as f:
        return json.load(f)
MiB, KiB = 1024 * 1024, 1024
rows, tot = [], {"conns": 0, "rss0": 0, "rss": 0, "alloc0": 0, "alloc": 0, "headroom": 0, "est": 0}
for i in range(nodes):
    b0, bm = load(f"{out}/n{i}.base.overview.json"), load(f"{out}/n{i}.base.memory.json")
    o, m = load(f"{out}/n{i}.full.overview.json"), load(f"{out}/n{i}.full.memory.json")
    n = o["connections"]
    rss0, rss = b0["process"]["rss_bytes"], o["process"]["rss_bytes"]
    a0, a = bm["allocated"], m["allocated"]
    cap = o["capacity"]
    try:
        g = load(f"{out}/gen{i}.json")
    except (OSError, ValueError):
        g = {}
    rows.append((f"n{i}", n, rss0, rss, (rss - rss0) / n, (a - a0) / n, m["per_connection_bytes"],
                 cap["headroom_connections"], cap["limiting_resource"], o["process"]["open_fds"],
                 o.get("cluster", {}).get("users_on_other_nodes", 0), g))
    tot["conns"] += n; tot["rss0"] += rss0; tot["rss"] += rss; tot["alloc0"] += a0; tot["alloc"] += a
    tot["headroom"] += cap["headroom_connections"]; tot["est"] += m["per_connection_bytes"] * n
print()
print(f"{'node':<6}{'connections':>12}{'RSS at 0':>11}{'RSS at N':>11}{'KiB/conn':>10}{'heap KiB/conn':>15}{'own est. KiB':>14}{'headroom':>10}  limit  fds     remote users")
for (name, n, rss0, rss, per, heap, est, head, lim, fds, remote, g) in rows:
    print(f"{name:<6}{n:>12,}{rss0 / MiB:>7.1f} MiB{rss / MiB:>7.1f} MiB{per / KiB:>10.2f}{heap / KiB:>15.2f}{est / KiB:>14.2f}{head:>10,}  {lim:<6} {fds:<7,} {remote:,}")
n = tot["conns"]
print(f"{'total':<6}{n:>12,}{tot['rss0'] / MiB:>7.1f} MiB{tot['rss'] / MiB:>7.1f} MiB"
      f"{(tot['rss'] - tot['rss0']) / n / KiB:>10.2f}{(tot['alloc'] - tot['alloc0']) / n / KiB:>15.2f}"
      f"{tot['est'] / n / KiB:>14.2f}{tot['headroom']:>10,}")
print()
print("KiB/conn = (RSS at N - RSS at 0) / N; heap = jemalloc allocated, same formula; own est. = the node's per_connection_bytes; headroom = more connections the node says it can take")
print()
for (name, n, *_rest, g) in rows:
    if not g:
        print(f"{name}: no generator report")
        continue
    c, l = g["connect_us"], g["login_us"]
    print(f"{name} generator: {g['established']:,} established, {g['failed']} failed, {g['dropped']} dropped, "
          f"{g['ramp_rate']:.0f} conn/s; connect p50 {c['p50'] / 1000:.2f} ms p99 {c['p99'] / 1000:.2f} ms; "
          f"login p50 {l['p50'] / 1000:.2f} ms p99 {l['p99'] / 1000:.2f} ms; "
          f"{g['messages_acked']}/{g['messages_sent']} msgs acked, {g['messages_delivered']} delivered; passed {g['passed']}")
PY
exit $rc
