#!/usr/bin/env bash
# Side by side with Mosquitto and NATS (BENCHMARKS.md): the same three loads, driven by
# `im-bench peer`, against im-server (protocol im), Mosquitto (MQTT 3.1.1 over WebSocket)
# and nats-server (NATS over WebSocket), in one sitting, ROUNDS times, medians printed:
#   - RSS per idle connection (IDLE connections, each authenticated and subscribed);
#   - server CPU per delivery, one topic/group of MEMBERS subscribers at 20 and 50 msg/s;
#   - delivery P99 at 50 msg/s into MEMBERS subscribers;
#   - server CPU per one-to-one message with its ack, PAIRS pairs x 10 msg/s.
# It starts its own Mosquitto (bench/configs/peers/mosquitto.conf: MQTT 127.0.0.1:28883,
# WebSocket :28080) and nats-server (bench/configs/peers/nats.conf: 127.0.0.1:28222,
# WebSocket 127.0.0.1:28081), fresh at each round, and a fresh im-server per run
# (`im-bench --spawn`, ephemeral loopback ports, temporary SQLite data dir). The machine's
# own services (Mosquitto on 1883, NATS on 4222) are not touched. Everything it started
# is killed on exit.
# Usage: cargo build --release -p im-server -p im-bench && bench/scripts/peers.sh
#   env: ROUNDS (3), IDLE (10000), MEMBERS (1000), PAIRS (100), DURATION (10s),
#        WARMUP (3s), OUT (a directory to keep each run's JSON and log in).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
T="${CARGO_TARGET_DIR:-target}/release"
ROUNDS="${ROUNDS:-3}"
IDLE="${IDLE:-10000}"
MEMBERS="${MEMBERS:-1000}"
PAIRS="${PAIRS:-100}"
DURATION="${DURATION:-10s}"
WARMUP="${WARMUP:-3s}"
MQTT_WS=ws://127.0.0.1:28080/
NATS_WS=ws://127.0.0.1:28081/

# Bounded load: the open-files limit is per process (the bench holds IDLE sockets).
if (( IDLE > 19000 || MEMBERS > 19000 || PAIRS > 9000 )); then
  echo "peers: IDLE (<= 19000), MEMBERS (<= 19000) or PAIRS (<= 9000) is over the bound" >&2
  exit 2
fi
# shellcheck source=bench/scripts/peers-lib.sh
source "$ROOT/bench/scripts/peers-lib.sh"

for round in $(seq 1 "$ROUNDS"); do
  start_peers
  for s in im mosquitto nats; do
    run "idle-$s-$round" "$s" idle --connections "$IDLE" --warmup "$WARMUP" --duration 5s
  done
  for s in im mosquitto nats; do
    for rate in 20 50; do
      run "bcast$rate-$s-$round" "$s" broadcast --members "$MEMBERS" --rate "$rate" \
        --warmup "$WARMUP" --duration "$DURATION" --drain 5s
    done
    run "pairs-$s-$round" "$s" pairs --pairs "$PAIRS" --rate 10 \
      --warmup "$WARMUP" --duration "$DURATION" --drain 5s
  done
done
stop_peers

python3 - "$OUT" "$ROUNDS" "$IDLE" "$MEMBERS" "$PAIRS" <<'PY'
import json, statistics, sys
out, rounds, idle, members, pairs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
servers = ["im", "mosquitto", "nats"]

def load(name):
    try:
        with open(f"{out}/{name}.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}

def med(prefix, server, get):
    vals = []
    for r in range(1, rounds + 1):
        try:
            v = get(load(f"{prefix}-{server}-{r}"))
        except (KeyError, TypeError):
            v = None
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else None

def fmt(v, unit, digits=1):
    return "-" if v is None else f"{v:.{digits}f} {unit}"

rows = [
    (f"RSS per idle connection ({idle} connections)", "idle",
     lambda j: j["rss_per_connection"] / 1024, "KiB"),
    (f"server CPU per delivery, {members} members, 20 msg/s", "bcast20",
     lambda j: j["cpu_us_per_delivery"], "µs"),
    (f"server CPU per delivery, {members} members, 50 msg/s", "bcast50",
     lambda j: j["cpu_us_per_delivery"], "µs"),
    (f"delivery P99, {members} members, 50 msg/s", "bcast50",
     lambda j: j["delivery_latency"]["p99"] / 1000, "ms"),
    (f"deliveries lost, {members} members, 50 msg/s", "bcast50",
     lambda j: j["delivery"]["lost"], ""),
    (f"server CPU per 1:1 message + ack, {pairs} pairs x 10 msg/s", "pairs",
     lambda j: j["cpu_us_per_message"], "µs"),
    (f"send-to-ack P99, {pairs} pairs x 10 msg/s", "pairs",
     lambda j: j["ack_latency"]["p99"] / 1000, "ms"),
]
w = max(len(r[0]) for r in rows)
print(f"{'median of ' + str(rounds) + ' round(s)':<{w}}  {'im-server':>12}  {'mosquitto':>12}  {'nats-server':>12}")
for label, prefix, get, unit in rows:
    cells = [fmt(med(prefix, s, get), unit, 0 if unit == "" else (2 if unit == "ms" else 1)) for s in servers]
    print(f"{label:<{w}}  " + "  ".join(f"{c:>12}" for c in cells))
failed = [n for n in (f"{p}-{s}-{r}" for p in ("idle", "bcast20", "bcast50", "pairs")
                       for s in servers for r in range(1, rounds + 1))
          if load(n).get("passed") is not True]
if failed:
    print("runs that did not pass (see their .log): " + ", ".join(failed))
print(f"runs kept in {out}")
PY
