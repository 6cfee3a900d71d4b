#!/usr/bin/env bash
# The curves of BENCHMARKS.md: how cost grows with the work, im-server beside Mosquitto
# (MQTT 3.1.1 over WebSocket) where it has the same load, every point one `im-bench peer`
# run (its JSON kept in $OUT), then bench/scripts/plot.py draws the SVGs:
#   - fanout: server CPU per delivery against group size (SIZES), at a fixed
#     DELIVERIES per second (the message rate is DELIVERIES / size), every group pushed
#     (the spawned im-server runs with flow.notify_group_threshold above the largest size:
#     the curve is the push path's, as Mosquitto's is);
#   - idle: server RSS against idle authenticated connections (CONNS), each run on a
#     fresh server;
#   - load: send-to-ack P99 against offered one-to-one load (PAIRS pairs x 10 msg/s each,
#     sends spread evenly), up to saturation (im-server acks after its durable commit,
#     Mosquitto's QoS 1 PUBACK comes from memory).
# Usage: cargo build --release -p im-server -p im-bench && bench/scripts/curves.sh
#   env: SIZES ("100 300 1000 3000 10000"), DELIVERIES (20000), CONNS ("1000 5000 10000
#        19000"), PAIRS ("100 300 1000 2000 4000"), DURATION (10s), WARMUP (3s),
#        OUT (bench/results/curves), PLOTS (bench/plots), KINDS ("fanout idle load": which
#        curves to run; the plots are drawn from every result in OUT), SERVERS ("im
#        mosquitto").
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
T="${CARGO_TARGET_DIR:-target}/release"
SIZES="${SIZES:-100 300 1000 3000 10000}"
DELIVERIES="${DELIVERIES:-20000}"
CONNS="${CONNS:-1000 5000 10000 19000}"
PAIRS="${PAIRS:-100 300 1000 2000 4000}"
DURATION="${DURATION:-10s}"
WARMUP="${WARMUP:-3s}"
OUT="${OUT:-$ROOT/bench/results/curves}"
PLOTS="${PLOTS:-$ROOT/bench/plots}"
KINDS="${KINDS:-fanout idle load}"
SERVERS="${SERVERS:-im mosquitto}"
# Pushes to every group size (im-bench --spawn passes its environment to the server).
export IM_FLOW_NOTIFY_GROUP_THRESHOLD=20000
MQTT_WS=ws://127.0.0.1:28080/
NATS_WS=ws://127.0.0.1:28081/

for n in $SIZES $CONNS; do
  (( n <= 19000 )) || { echo "curves: $n is over the 19,000 sockets one bench process holds" >&2; exit 2; }
done
for n in $PAIRS; do
  (( n <= 9000 )) || { echo "curves: $n pairs is over the bound (9,000)" >&2; exit 2; }
done

# shellcheck source=bench/scripts/peers-lib.sh
source "$ROOT/bench/scripts/peers-lib.sh"

wants() { [[ " $KINDS " == *" $1 "* ]]; }
start_peers
for s in $SERVERS; do
  if wants fanout; then
    for n in $SIZES; do
      rate=$(python3 -c "print(max(1, round($DELIVERIES / $n)))")
      run "fanout-$s-$n" "$s" broadcast --members "$n" --rate "$rate" \
        --warmup "$WARMUP" --duration "$DURATION" --drain 5s
    done
  fi
  if wants idle; then
    for n in $CONNS; do
      start_peers # a fresh broker: memory freed by earlier runs would hide the growth
      run "idle-$s-$n" "$s" idle --connections "$n" --warmup "$WARMUP" --duration 5s
    done
  fi
  if wants load; then
    for n in $PAIRS; do
      run "load-$s-$n" "$s" pairs --pairs "$n" --rate 10 \
        --warmup "$WARMUP" --duration "$DURATION" --drain 5s
    done
  fi
done
stop_peers
python3 "$ROOT/bench/scripts/plot.py" "$OUT" "$PLOTS"
