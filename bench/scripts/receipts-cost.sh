#!/usr/bin/env bash
# receipts-cost.sh: what read receipts cost the server in a large group.
#
# Each round runs `im-bench broadcast` (one group of MEMBERS, RATE msg/s, every member
# acking once a second) once per mode, in turn, on a fresh spawned im-server:
#   plain   members send DeliverAcks only
#   read    members also send a MarkRead with each DeliverAck, as an app showing the
#           conversation does; the server's receipt policy (`receipts.*`, default: count
#           mode above 100 members) decides what it pushes
#   EXTRA   optional: a third mode, `read` with the server env given in EXTRA_ENV
#           (e.g. EXTRA_ENV=IM_RECEIPTS_GROUP_MEMBER_MAX=1000 for per-member receipts)
# It reads the spawned server's CPU time (utime + stime from /proc) when the bench's
# measured window starts and ends, and divides by the deliveries in that window: server
# CPU per delivery, in µs. Every run must pass the bench's exactly-once check. The report
# gives each run and the median per mode.
#
# Needs the release im-server and im-bench (cargo build --release).
# Usage: bench/scripts/receipts-cost.sh   (env: ROUNDS MEMBERS RATE DURATION WARMUP
#        EXTRA_ENV SERVER BENCH)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
SERVER=${SERVER:-$TARGET/release/im-server}
BENCH=${BENCH:-$TARGET/release/im-bench}
ROUNDS=${ROUNDS:-3}
MEMBERS=${MEMBERS:-1000}
RATE=${RATE:-20}
DURATION=${DURATION:-20}
WARMUP=${WARMUP:-5}
EXTRA_ENV=${EXTRA_ENV:-}
TICK=$(getconf CLK_TCK)

for bin in "$SERVER" "$BENCH"; do
    [ -x "$bin" ] || { echo "missing $bin: run cargo build --release" >&2; exit 2; }
done
WORK=$(mktemp -d -t im-receipts-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

cpu_ticks() { # PID: utime + stime in clock ticks (empty once the process is gone)
    awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || true
}

run() { # MODE: prints "MODE us_per_delivery deliveries cpu_s"
    local mode=$1 out=$WORK/$1.out args=()
    case $mode in
        plain) ;;
        read) args+=(--mark-read) ;;
        extra) args+=(--mark-read --server-env "$EXTRA_ENV") ;;
    esac
    "$BENCH" broadcast --spawn "$SERVER" --groups 1 --members "$MEMBERS" --rate "$RATE" \
        --warmup "${WARMUP}s" --duration "${DURATION}s" "${args[@]}" >"$out" 2>&1 &
    local bench=$! pid="" t0="" t1="" s0="" s1="" now=""
    while kill -0 "$bench" 2>/dev/null; do
        [ -z "$pid" ] && pid=$(pgrep -P "$bench" -f "$SERVER" | head -n1 || true)
        # The window runs from the first "measure" progress line to the first "drain"
        # one; t1 is the last reading taken inside it (at most 0.1 s early).
        if [ -n "$pid" ] && ! grep -q "drain  \]" "$out"; then
            if [ -z "$t0" ] && grep -q "measure\]" "$out"; then
                t0=$(cpu_ticks "$pid")
                s0=$(date +%s.%N)
            elif [ -n "$t0" ]; then
                now=$(cpu_ticks "$pid")
                [ -n "$now" ] && t1=$now && s1=$(date +%s.%N)
            fi
        fi
        sleep 0.1
    done
    wait "$bench" || { echo "bench failed ($mode):" >&2; tail -n 20 "$out" >&2; exit 1; }
    grep -q "correctness      PASS" "$out" || { echo "correctness failed ($mode)" >&2; exit 1; }
    [ -n "$t0" ] && [ -n "$t1" ] || { echo "no measured window seen ($mode)" >&2; exit 1; }
    local n
    n=$(sed -n 's/.*(\([0-9]*\) in the measured window).*/\1/p' "$out")
    # Deliveries are scaled from the whole window to the part the CPU readings span.
    awk -v m="$mode" -v a="$t0" -v b="$t1" -v t="$TICK" -v n="$n" -v w="$DURATION" \
        -v s0="$s0" -v s1="$s1" \
        'BEGIN { c = (b - a) / t; d = n * (s1 - s0) / w;
                 printf "%s %.2f %d %.2f\n", m, c * 1e6 / d, n, c }'
    grep -E "^members|^server  " "$out" | sed 's/^/    /' >&2
}

MODES=(plain read)
[ -n "$EXTRA_ENV" ] && MODES+=(extra)
echo "receipts cost: 1 group x $MEMBERS members, $RATE msg/s, ${DURATION}s measured, $ROUNDS rounds"
for r in $(seq 1 "$ROUNDS"); do
    for m in "${MODES[@]}"; do
        line=$(run "$m")
        echo "round $r: $line"
        echo "$line" >>"$WORK/results"
    done
done
echo "median server CPU per delivery (µs):"
for m in "${MODES[@]}"; do
    awk -v m="$m" '$1 == m { print $2 }' "$WORK/results" | sort -n |
        awk -v m="$m" '{ v[NR] = $1 } END { printf "  %-6s %s  (runs: %d)\n", m, v[int((NR + 1) / 2)], NR }'
done
