#!/usr/bin/env bash
# benchmarks.sh: runs the figures of BENCHMARKS.md and prints their medians.
#
# Every run spawns a fresh release im-server (--spawn) and keeps its --json report in
# $OUT/NAME.ROUND.json (stderr, with the progress lines, in .err). Before each run the
# script waits until no foreign compile or benchmark is running (rustc, cargo, or an
# im-server / im-bench that is not ours); if one starts during the run, the run is
# marked noisy and repeated (up to 3 attempts; the last is kept and flagged).
#
# Usage: bench/scripts/benchmarks.sh [GROUP...]   groups: idle idlews chat (closed loop
#        and sweep) sweep storm group mix roundtrip chaos extra (default: all but sweep,
#        which chat includes). Env: ROUNDS (3), OUT, SERVER, BENCH, RATES (the chat
#        --rate sweep), SWEEP_ROUNDS (1), QUIET_MAX_WAIT (seconds, 1800).
# Needs target/release/im-server and im-bench (cargo build --release -p im-server
# -p im-bench) and jq.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SERVER=${SERVER:-$ROOT/target/release/im-server}
BENCH=${BENCH:-$ROOT/target/release/im-bench}
OUT=${OUT:-$ROOT/target/bench-results}
ROUNDS=${ROUNDS:-3}
RATES=${RATES:-4000 5000 6000 7000 8000 10000 12000}
QUIET_MAX_WAIT=${QUIET_MAX_WAIT:-1800}
GROUPS_TO_RUN=("$@")
[ ${#GROUPS_TO_RUN[@]} -eq 0 ] && GROUPS_TO_RUN=(idle idlews chat storm group mix roundtrip chaos extra)

for bin in "$SERVER" "$BENCH"; do
    [ -x "$bin" ] || { echo "missing $bin: cargo build --release -p im-server -p im-bench" >&2; exit 2; }
done
command -v jq >/dev/null || { echo "needs jq" >&2; exit 2; }
mkdir -p "$OUT"

# Foreign heavy processes: compiles, and im-server/im-bench binaries other than ours.
foreign() {
    ps -eo pid,stat,comm,args --no-headers | awk -v s="$SERVER" -v b="$BENCH" '
        $2 ~ /^Z/ { next }
        $3 == "rustc" || $3 == "cargo" || $3 == "cc1" || $3 == "ld" { print; next }
        ($3 == "im-server" || $3 == "im-bench") && $4 != s && $4 != b { print }'
}

quiet() {
    local waited=0
    while [ -n "$(foreign)" ]; do
        if [ "$waited" -eq 0 ]; then
            echo "  (waiting for a quiet machine: $(foreign | head -n 1 | cut -c1-100))" >&2
        fi
        sleep 5
        waited=$((waited + 5))
        if [ "$waited" -ge "$QUIET_MAX_WAIT" ]; then
            echo "  (still busy after ${waited}s; running anyway)" >&2
            return
        fi
    done
}

# measure NAME ROUND ARGS...: one run, repeated while something else ran during it.
measure() {
    local name=$1 round=$2; shift 2
    local json="$OUT/$name.$round.json" err="$OUT/$name.$round.err" flag="$OUT/$name.$round.noisy"
    local attempt rc
    [ "$round" = 1 ] && rm -f "$OUT/$name".*.json "$OUT/$name".*.err "$OUT/$name".*.noisy
    for attempt in 1 2 3; do
        quiet
        rm -f "$flag"
        ( while sleep 0.5; do
              if [ -n "$(foreign)" ]; then foreign | head -n 1 > "$flag"; fi
          done ) &
        local watcher=$!
        rc=0
        "$BENCH" "$@" --spawn "$SERVER" --json > "$json" 2> "$err" || rc=$?
        kill "$watcher" 2>/dev/null || true
        wait "$watcher" 2>/dev/null || true
        if [ ! -s "$flag" ]; then
            rm -f "$flag"
            break
        fi
        echo "  $name round $round attempt $attempt was noisy: $(cut -c1-100 "$flag")" >&2
    done
    echo "  $name round $round: exit $rc$( [ -f "$flag" ] && echo ' (noisy)')" >&2
    [ "$rc" -le 1 ] || { tail -n 5 "$err" >&2; }
}

# median NAME JQ_EXPR: the median over the rounds of a number in the reports.
median() {
    local name=$1 expr=$2
    cat "$OUT/$name".*.json 2>/dev/null | jq -s "map($expr) | sort | .[(length - 1) / 2 | floor]"
}

# all NAME JQ_EXPR: the values of every round, comma separated.
all() {
    local name=$1 expr=$2
    cat "$OUT/$name".*.json 2>/dev/null | jq -rs "map($expr | tostring) | join(\", \")"
}

rounds() { seq 1 "$ROUNDS"; }

run_idle() {
    echo "idle: 19,000 connections, memory at 1,000 / 10,000 / 19,000" >&2
    for r in $(rounds); do
        measure idle "$r" idle --connections 19000 --ramp 30s --checkpoints 1000,10000 --duration 30s
    done
}

run_idlews() {
    echo "idle: 19,000 connections with WebSocket pings every 10 s" >&2
    measure idle-ws 1 idle --connections 19000 --ramp 30s --duration 30s --ping-kind ws --ping-interval 10s
}

run_chat() {
    echo "chat: closed loop, then the --rate sweep" >&2
    for r in $(rounds); do
        measure chat-max "$r" chat --senders 100 --window 8 --duration 15s
    done
    run_sweep
}

run_sweep() {
    echo "chat: --rate sweep (200 pairs, window 16), ${SWEEP_ROUNDS:-1} round(s) per rate" >&2
    # Round-major, so that a slow spell of the disk does not land on one rate only.
    for r in $(seq 1 "${SWEEP_ROUNDS:-1}"); do
        for rate in $RATES; do
            measure "chat-rate-$rate" "$r" chat --senders 200 --window 16 --rate "$rate" --duration 15s
        done
    done
}

run_extra() {
    echo "extras: the ramp at full speed, DeliverAck-free fan-out, notify-and-pull at fixed rates" >&2
    measure idle-fastramp 1 idle --connections 19000 --ramp 5s --duration 5s --send-prob 0
    measure storm-noack 1 broadcast --groups 10 --members 1000 --rate 5 --warmup 5s --duration 30s \
        --deliver-ack-every 0
    measure group5k-noack 1 broadcast --groups 1 --members 5000 --rate 0 --window 16 \
        --deliver-ack-every 0 --server-env IM_FLOW_NOTIFY_GROUP_THRESHOLD=10000 --warmup 3s --duration 20s
    for rate in 20 50; do
        measure "group5k-pull-$rate" 1 broadcast --groups 1 --members 5000 --rate "$rate" --pull \
            --warmup 3s --duration 20s
    done
    # At 50 msg/s the members fall behind: a long drain shows that they catch up, with
    # nothing lost, once the sender stops.
    measure group5k-pull-50-drain 1 broadcast --groups 1 --members 5000 --rate 50 --pull \
        --warmup 3s --duration 20s --drain 90s
}

run_storm() {
    echo "broadcast storm: 10 groups x 1,000 members, 5 msg/s each" >&2
    for r in $(rounds); do
        measure storm "$r" broadcast --groups 10 --members 1000 --rate 5 --warmup 5s --duration 30s
    done
}

run_group() {
    echo "one 5,000-member group, as fast as acks allow (pushed, then notify-and-pull)" >&2
    for r in $(rounds); do
        measure group5k "$r" broadcast --groups 1 --members 5000 --rate 0 --window 16 \
            --server-env IM_FLOW_NOTIFY_GROUP_THRESHOLD=10000 --warmup 3s --duration 20s
    done
    measure group5k-pull 1 broadcast --groups 1 --members 5000 --rate 0 --window 16 --pull \
        --warmup 3s --duration 20s
}

run_mix() {
    echo "mix: 1,000 users, zipf 1.0, default size mix" >&2
    for r in $(rounds); do
        measure mix "$r" mix --users 1000 --rate 2000 --duration 20s
    done
}

run_roundtrip() {
    echo "roundtrip: 100 pairs" >&2
    for r in $(rounds); do
        measure roundtrip "$r" roundtrip --pairs 100 --duration 15s
    done
}

run_chaos() {
    echo "chaos: 100 pairs, 2% killed per second, 1% malformed frames" >&2
    for r in $(rounds); do
        measure chaos "$r" chaos --senders 100 --window 4 --kill-percent 2 --bad-percent 1 --duration 20s
    done
}

for g in "${GROUPS_TO_RUN[@]}"; do "run_$g"; done

# The summary (medians over the rounds; ms from µs).
ms='/ 1000 | . * 10 | round / 10'
echo
for g in "${GROUPS_TO_RUN[@]}"; do
    case $g in
    idle)
        echo "idle 19k: rss/conn B $(all idle '.memory_per_connection_bytes | round'); at 1000: $(all idle '.checkpoints[0].rss_per_connection | round'); at 10000: $(all idle '.checkpoints[1].rss_per_connection | round'); heap/conn: $(all idle '.checkpoints[-1].heap_per_connection | round')"
        echo "  ramp conns/s $(all idle '.ramp_rate | round'); connect p99 ms $(median idle ".connect_us.p99 $ms"); login p99 ms $(median idle ".login_us.p99 $ms"); heartbeat p99 ms $(median idle ".ping_rtt_us.p99 $ms"); pass $(all idle .passed)"
        ;;
    idlews)
        echo "idle 19k, ws pings every 10 s: rss/conn B $(all idle-ws '.memory_per_connection_bytes | round'); heartbeat p50/p99 ms $(median idle-ws ".ping_rtt_us.p50 $ms") / $(median idle-ws ".ping_rtt_us.p99 $ms"); pass $(all idle-ws .passed)"
        ;;
    chat)
        echo "chat closed loop (100 x window 8): acked/s $(all chat-max '.acked_per_sec | round'); p50/p99/p999 ms $(median chat-max ".send_to_ack_us.p50 $ms") / $(median chat-max ".send_to_ack_us.p99 $ms") / $(median chat-max ".send_to_ack_us.p999 $ms"); pass $(all chat-max .passed)"
        ;&  # chat includes the sweep
    sweep)
        for rate in $RATES; do
            echo "  rate $rate: acked/s $(median "chat-rate-$rate" '.acked_per_sec | round'); send->ack p50 $(median "chat-rate-$rate" ".send_to_ack_us.p50 $ms") p99 $(median "chat-rate-$rate" ".send_to_ack_us.p99 $ms") p999 $(median "chat-rate-$rate" ".send_to_ack_us.p999 $ms") ms; server cpu $(median "chat-rate-$rate" '.server.cpu_busy'); pass $(all "chat-rate-$rate" .passed)"
        done
        ;;
    extra)
        echo "fast ramp: $(all idle-fastramp '.ramp_rate | round') conns/s, connect p99 ms $(median idle-fastramp ".connect_us.p99 $ms"), login p99 ms $(median idle-fastramp ".login_us.p99 $ms"), failed $(all idle-fastramp .failed)"
        echo "storm without DeliverAcks: delivery p50/p99/p999 ms $(median storm-noack ".delivery_us.p50 $ms") / $(median storm-noack ".delivery_us.p99 $ms") / $(median storm-noack ".delivery_us.p999 $ms"); send->ack p99 $(median storm-noack ".send_to_ack_us.p99 $ms"); pass $(all storm-noack .passed)"
        echo "group 5000 pushed without DeliverAcks: deliveries/s $(all group5k-noack '.deliveries_per_sec | round'); msgs/s $(median group5k-noack '.acked_per_sec | round'); delivery p99 ms $(median group5k-noack ".delivery_us.p99 $ms"); pass $(all group5k-noack .passed)"
        for rate in 20 50 50-drain; do
            echo "group 5000 notify-and-pull at $rate msg/s: deliveries/s $(all "group5k-pull-$rate" '.deliveries_per_sec | round'); delivery p50/p99 ms $(median "group5k-pull-$rate" ".delivery_us.p50 $ms") / $(median "group5k-pull-$rate" ".delivery_us.p99 $ms"); syncs $(median "group5k-pull-$rate" .sync_requests); pass $(all "group5k-pull-$rate" .passed)"
        done
        ;;
    storm)
        echo "storm: deliveries/s $(all storm '.deliveries_per_sec | round'); delivery p50/p95/p99/p999 ms $(median storm ".delivery_us.p50 $ms") / $(median storm ".delivery_us.p95 $ms") / $(median storm ".delivery_us.p99 $ms") / $(median storm ".delivery_us.p999 $ms"); send->ack p99 $(median storm ".send_to_ack_us.p99 $ms"); server cpu $(median storm '.server.cpu_busy'); rss MiB $(median storm '.server.rss_bytes / 1048576 | round'); pass $(all storm .passed)"
        ;;
    group)
        echo "group 5000 pushed: deliveries/s $(all group5k '.deliveries_per_sec | round'); msgs/s $(median group5k '.acked_per_sec | round'); delivery p50/p99 ms $(median group5k ".delivery_us.p50 $ms") / $(median group5k ".delivery_us.p99 $ms"); server cpu $(median group5k '.server.cpu_busy'); pass $(all group5k .passed)"
        echo "  notify-and-pull: deliveries/s $(all group5k-pull '.deliveries_per_sec | round'); msgs/s $(median group5k-pull '.acked_per_sec | round'); delivery p50/p99 ms $(median group5k-pull ".delivery_us.p50 $ms") / $(median group5k-pull ".delivery_us.p99 $ms"); syncs $(median group5k-pull .sync_requests); pass $(all group5k-pull .passed)"
        ;;
    mix)
        echo "mix: acked/s $(all mix '.acked_per_sec | round'); text p99 $(median mix ".classes[0].send_to_ack_us.p99 $ms"), image p99 $(median mix ".classes[1].send_to_ack_us.p99 $ms"), file p99 $(median mix ".classes[2].send_to_ack_us.p99 $ms") ms send->ack; payload MiB/s $(median mix '.acked_bytes_per_sec / 1048576 | . * 10 | round / 10'); pass $(all mix .passed)"
        ;;
    roundtrip)
        echo "roundtrip: exchanges/s $(all roundtrip '.exchanges_per_sec | round'); round trip p50/p95/p99/p999 ms $(median roundtrip ".round_trip_us.p50 $ms") / $(median roundtrip ".round_trip_us.p95 $ms") / $(median roundtrip ".round_trip_us.p99 $ms") / $(median roundtrip ".round_trip_us.p999 $ms"); cursor lag $(all roundtrip .cursor_lag_messages); pass $(all roundtrip .passed)"
        ;;
    chaos)
        echo "chaos: kills $(all chaos .kills); reconnect p50/p99 ms $(median chaos ".reconnect_us.p50 $ms") / $(median chaos ".reconnect_us.p99 $ms"); recover p50/p99 ms $(median chaos ".recover_us.p50 $ms") / $(median chaos ".recover_us.p99 $ms"); acked/s $(median chaos '.acked_per_sec | round'); bad frames $(all chaos '.bad_frames_sent') answered $(all chaos '.bad_frames_answered'); pass $(all chaos .passed)"
        ;;
    esac
done
