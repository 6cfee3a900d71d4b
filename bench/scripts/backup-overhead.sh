#!/usr/bin/env bash
# backup-overhead.sh: how long `im-server backup` takes on a store of N messages, and what
# it costs the message path while it runs.
#
# Two fresh im-servers side by side (each its own data dir and ports), both first filled
# with the same chat load (PREFILL_SECS), then both loaded at once by their own
# `im-bench chat --rate RATE` for DURATION. On the server `backup`, `im-server backup`
# runs back to back for the whole measured window (each into a new file); `plain` runs
# none. Prints both benches' reports (send->SendAck and send->deliver percentiles) and
# every backup's line (messages, pages, bytes, milliseconds).
#
# Build first: cargo build --release -p im-server -p im-bench
# Usage: bench/scripts/backup-overhead.sh   (env: SERVER BENCH RATE SENDERS DURATION
#        PREFILL_SECS PORT_BASE)
set -euo pipefail

SERVER=${SERVER:-target/release/im-server}
BENCH=${BENCH:-target/release/im-bench}
RATE=${RATE:-500}
SENDERS=${SENDERS:-50}
DURATION=${DURATION:-20}
PREFILL_SECS=${PREFILL_SECS:-20}
PORT_BASE=${PORT_BASE:-29070}
SECRET=backup-bench-secret-of-at-least-32-bytes
TOKEN=backup-bench-admin-of-at-least-32-bytes

for bin in "$SERVER" "$BENCH"; do
    [ -x "$bin" ] || { echo "missing $bin: see the build command at the top" >&2; exit 2; }
done
WORK=$(mktemp -d /tmp/im-backup-bench.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

start() { # name port
    local dir="$WORK/$1"
    mkdir -p "$dir"
    IM_DATA_DIR="$dir/data" IM_LISTEN="127.0.0.1:$2" IM_ADMIN_LISTEN="127.0.0.1:$(($2 + 1))" \
        IM_JWT_SECRET=$SECRET IM_ADMIN_TOKEN=$TOKEN IM_LOG=warn \
        "$SERVER" 2>"$dir/server.log" &
    PIDS+=($!)
    for _ in $(seq 1 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "server $1 did not start: $(cat "$dir/server.log")" >&2
    exit 1
}

chat() { # port rate duration out
    "$BENCH" chat --url "ws://127.0.0.1:$1/ws" --admin-url "http://127.0.0.1:$(($1 + 1))" \
        --admin-token $TOKEN --secret $SECRET --senders "$SENDERS" --rate "$2" \
        --warmup 2s --duration "${3}s" >"$4" 2>&1
}

start plain "$PORT_BASE"
start backup "$((PORT_BASE + 2))"

echo "prefill: ${PREFILL_SECS}s of chat at 2000 msg/s on each"
chat "$PORT_BASE" 2000 "$PREFILL_SECS" "$WORK/prefill-plain.txt" &
p1=$!
chat "$((PORT_BASE + 2))" 2000 "$PREFILL_SECS" "$WORK/prefill-backup.txt" &
p2=$!
wait $p1 $p2

echo "measured: ${DURATION}s of chat at $RATE msg/s on each; backups back to back on 'backup'"
chat "$PORT_BASE" "$RATE" "$DURATION" "$WORK/plain.txt" &
b1=$!
chat "$((PORT_BASE + 2))" "$RATE" "$DURATION" "$WORK/backup.txt" &
b2=$!
sleep 2 # the warmup
n=0
while kill -0 $b2 2>/dev/null; do
    n=$((n + 1))
    IM_DATA_DIR="$WORK/backup/data" "$SERVER" backup "$WORK/backup/copy-$n.db" \
        >>"$WORK/backups.txt" 2>&1 || true
    rm -f "$WORK/backup/copy-$n.db"
done
wait $b1 $b2 || true

echo "== plain (no backup)"
cat "$WORK/plain.txt"
echo "== backup (im-server backup back to back)"
cat "$WORK/backup.txt"
echo "== backups ($n)"
cat "$WORK/backups.txt"
