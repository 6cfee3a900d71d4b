#!/usr/bin/env bash
# before-send.sh: what the before-send hook adds to send->ack latency. Starts a local
# hook receiver (Node's http server answering {"action":"allow"} at once, keep-alive),
# then runs the same paced `im-bench chat` load against a fresh im-server without the
# hook and one with it, alternately, ROUNDS times (both see the same machine
# conditions), and prints each run's send->ack P50/P99 and the hook's own figures.
#
# Env: SERVER, BENCH (release binaries), ROUNDS (3), SENDERS (20), RATE (400 msg/s in
# all), WINDOW (4), DURATION (10s), PORT (the receiver's, 18090), SYNC (the servers'
# store.sqlite_synchronous, full; normal takes the fsync tail out of the figures).
# Needs node and jq.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SERVER=${SERVER:-$ROOT/target/release/im-server}
BENCH=${BENCH:-$ROOT/target/release/im-bench}
ROUNDS=${ROUNDS:-3}
SENDERS=${SENDERS:-20}
RATE=${RATE:-400}
WINDOW=${WINDOW:-4}
DURATION=${DURATION:-10s}
PORT=${PORT:-18090}
SYNC=${SYNC:-full}
SECRET=bench-hook-secret-of-at-least-32-bytes

command -v node >/dev/null && command -v jq >/dev/null || { echo "needs node and jq" >&2; exit 2; }
node -e '
const http = require("http");
http.createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    res.writeHead(200, {"content-type": "application/json"});
    res.end("{\"action\":\"allow\"}");
  });
}).listen(Number(process.argv[1]), "127.0.0.1");
' "$PORT" &
RECEIVER=$!
trap 'kill $RECEIVER 2>/dev/null || true' EXIT
sleep 0.5

run() { # MODE [server-env...]
    local mode=$1
    shift
    "$BENCH" chat --spawn "$SERVER" --senders "$SENDERS" --window "$WINDOW" --rate "$RATE" \
        --duration "$DURATION" --json --server-env "IM_STORE_SQLITE_SYNCHRONOUS=$SYNC" "$@" > "$WORK/$mode.$round.json" 2>> "$WORK/bench.log"
    jq -r --arg m "$mode" --arg r "$round" '
        def ms(x): (x / 10 | round) / 100;
        ([.server.stages[]? | select(.stage == "before_send")][0] // {count: 0}) as $h
        | "round \($r) \($m): acked/s \(.acked_per_sec | round) passed \(.passed)"
          + " send->ack p50 \(ms(.send_to_ack_us.p50)) ms p99 \(ms(.send_to_ack_us.p99)) ms"
          + (if $h.count > 0 then " | before_send stage p50 \(ms($h.p50_us)) ms p99 \(ms($h.p99_us)) ms" else "" end)' \
        "$WORK/$mode.$round.json"
}

WORK=$(mktemp -d -t before-send.XXXXXX)
trap 'kill $RECEIVER 2>/dev/null || true; rm -rf "$WORK"' EXIT
for round in $(seq 1 "$ROUNDS"); do
    run none
    run hook --server-env "IM_HOOKS_BEFORE_SEND_URL=http://127.0.0.1:$PORT/hook" \
        --server-env "IM_HOOKS_BEFORE_SEND_SECRET=$SECRET"
done
