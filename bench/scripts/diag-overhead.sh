#!/usr/bin/env bash
# diag-overhead.sh: what the live-diagnosis tools cost in message throughput.
#
# Each round starts fresh im-servers side by side, one per mode, and loads each with its
# own `im-bench chat` at the same time, so all of them see the same machine conditions:
#   plain      log.uid_filters = false: no connection span, no per-uid filtering at all
#   nofilter   the default config, no filter set
#   filters    the same with FILTERS (default 1000) debug filters on other uids
#   capture    the same while a CPU profile (format=bundle, 99 Hz) is captured and its
#              report built, inside the measured window
#   noprobes   the default config with stage probes off (obs.probes = false): the cost of
#              the probes is nofilter's ratio over this one
#   nomonitors the default config with the task monitors off (obs.task_monitors = false):
#              the cost of the monitors is nofilter's ratio over this one
#   noprof     SERVER_NOPROF (`--no-default-features`: jemalloc without its profiler), the
#              default config: the cost of the heap profiler compiled in and inactive is
#              nofilter's ratio over this one
#   trace1k    message traces sampled 1 in 1,000 (obs.trace_sample_rate = 0.001)
#   tracefilter a debug filter on one of the bench's senders (s0), so its messages are
#              traced and logged at debug: what diagnosing one user costs the node
#   traceall   every message traced (obs.trace_sample_rate = 1), the worst case
# All servers share CPU 0 and all benches CPU 1 (PIN=0 turns pinning off), so the
# servers are CPU-bound and compete on equal terms. Per server, over the middle of the
# measured window, it records: accepted msgs/s and messages per server CPU-second (the
# throughput one core sustains; robust against other processes on the machine). The
# report gives, per mode, the median over rounds of its ratio to `plain` in the same
# round, plus the bench's own acked msgs/s.
#
# Needs target/release/im-server and im-bench (cargo build --release), curl and jq; the
# noprof mode also needs the server built without the profiler:
#   cargo build --release -p im-server --no-default-features
#   cp target/release/im-server target/release/im-server-noprof
#   cargo build --release -p im-server -p im-bench
# Usage: bench/scripts/diag-overhead.sh   (env: ROUNDS DURATION WARMUP SENDERS WINDOW
#        FILTERS SYNC PIN PORT_BASE SERVER BENCH MODES; defaults below; MODES is a
#        space-separated subset of the modes, `plain` included)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SERVER=${SERVER:-$ROOT/target/release/im-server}
SERVER_NOPROF=${SERVER_NOPROF:-$ROOT/target/release/im-server-noprof}
BENCH=${BENCH:-$ROOT/target/release/im-bench}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
SENDERS=${SENDERS:-50}
WINDOW=${WINDOW:-8}
FILTERS=${FILTERS:-1000}
SYNC=${SYNC:-normal}
PIN=${PIN:-1}
PORT_BASE=${PORT_BASE:-27070}
read -ra MODES <<<"${MODES:-plain nofilter filters capture noprobes nomonitors}"
has_mode() { [[ " ${MODES[*]} " == *" $1 "* ]]; }
has_mode plain || { echo "MODES must include plain" >&2; exit 2; }
SECRET=diag-bench-secret-of-at-least-32-bytes
TOKEN=diag-bench-admin-of-at-least-32-bytes
CAPTURE_SECS=$((DURATION - 4))

for bin in "$SERVER" "$BENCH"; do
    [ -x "$bin" ] || { echo "missing $bin: run cargo build --release" >&2; exit 2; }
done
if has_mode noprof; then
    [ -x "$SERVER_NOPROF" ] || { echo "missing $SERVER_NOPROF: see the build commands at the top" >&2; exit 2; }
fi
command -v jq >/dev/null || { echo "needs jq" >&2; exit 2; }
[ "$DURATION" -ge 6 ] || { echo "DURATION must be at least 6" >&2; exit 2; }

WORK=$(mktemp -d -t im-diag-bench.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

on_cpu() { # CPU cmd...: execs cmd pinned; call it with `&`, so `$!` is the command's pid
    if [ "$PIN" = 1 ]; then exec taskset -c "$1" "${@:2}"; else exec "${@:2}"; fi
}

admin() { # ADDR METHOD PATH [BODY]
    curl -sS -m 60 -X "$2" -H "Authorization: Bearer $TOKEN" \
        ${4:+-H 'Content-Type: application/json' -d "$4"} "http://$1$3"
}

# One sample of a server: messages accepted so far, its CPU seconds, wall seconds.
sample() { # ADDR PID
    local msgs cpu
    msgs=$(admin "$1" GET /metrics | awk '/^im_messages_received_total/ {s += $2} END {print s + 0}')
    cpu=$(awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$2/stat")
    echo "$msgs $cpu $(date +%s.%N)"
}

run_round() { # round
    local round=$1 k mode port dir
    declare -A addr pid
    for k in "${!MODES[@]}"; do
        mode=${MODES[$k]}
        port=$((PORT_BASE + 20 * round + 2 * k))
        dir="$WORK/r$round-$mode"
        mkdir -p "$dir"
        addr[$mode]=127.0.0.1:$((port + 1))
        local extra=()
        if [ "$mode" = plain ]; then extra+=(IM_LOG_UID_FILTERS=false); fi
        if [ "$mode" = noprobes ]; then extra+=(IM_OBS_PROBES=false); fi
        if [ "$mode" = nomonitors ]; then extra+=(IM_OBS_TASK_MONITORS=false); fi
        if [ "$mode" = trace1k ]; then extra+=(IM_OBS_TRACE_SAMPLE_RATE=0.001); fi
        if [ "$mode" = traceall ]; then extra+=(IM_OBS_TRACE_SAMPLE_RATE=1); fi
        local server=$SERVER
        if [ "$mode" = noprof ]; then server=$SERVER_NOPROF; fi
        on_cpu 0 env IM_LISTEN=127.0.0.1:$port IM_ADMIN_LISTEN="${addr[$mode]}" \
            IM_DATA_DIR="$dir/data" IM_JWT_SECRET=$SECRET IM_ADMIN_TOKEN=$TOKEN IM_LOG=info \
            IM_STORE_SQLITE_SYNCHRONOUS="$SYNC" IM_LIMITS_SEND_RATE_PER_SEC=0 "${extra[@]}" \
            "$server" 2>"$dir/server.log" &
        pid[$mode]=$!
        PIDS+=("$!")
    done
    for mode in "${MODES[@]}"; do
        dir="$WORK/r$round-$mode"
        for _ in $(seq 100); do
            grep -q "listening client=" "$dir/server.log" 2>/dev/null && break
            sleep 0.1
        done
        grep -q "listening client=" "$dir/server.log" || { cat "$dir/server.log" >&2; exit 2; }
    done
    if has_mode filters; then
        for i in $(seq "$FILTERS"); do
            admin "${addr[filters]}" PUT "/admin/v1/log-filters/other$i" \
                '{"level":"debug","ttl_secs":3600}' >/dev/null
        done
        local n
        n=$(admin "${addr[filters]}" GET /admin/v1/log-filters | jq '.filters | length')
        [ "$n" = "$FILTERS" ] || { echo "expected $FILTERS filters, got $n" >&2; exit 2; }
    fi
    if has_mode tracefilter; then
        admin "${addr[tracefilter]}" PUT /admin/v1/log-filters/s0 \
            '{"level":"debug","ttl_secs":3600}' >/dev/null
    fi

    # Start the benches in a rotating order (no mode always first).
    declare -A bench
    for j in "${!MODES[@]}"; do
        mode=${MODES[$(((j + round) % ${#MODES[@]}))]}
        k=0; for i in "${!MODES[@]}"; do if [ "${MODES[$i]}" = "$mode" ]; then k=$i; fi; done
        port=$((PORT_BASE + 20 * round + 2 * k))
        on_cpu 1 "$BENCH" --threads 1 chat --url "ws://127.0.0.1:$port/ws" --secret $SECRET \
            --senders "$SENDERS" --window "$WINDOW" --duration "${DURATION}s" \
            --warmup "${WARMUP}s" --drain 5s --json \
            >"$WORK/r$round-$mode/report.json" 2>"$WORK/r$round-$mode/bench.log" &
        bench[$mode]=$!
    done
    local capture_pid=
    if has_mode capture; then
        (sleep "$WARMUP.5"
         admin "${addr[capture]}" GET "/admin/v1/profile/cpu?seconds=$CAPTURE_SECS&format=bundle" \
            >"$WORK/r$round-capture/profile.json") &
        capture_pid=$!
    fi

    sleep "$WARMUP.5"; sleep 1
    declare -A s1 s2
    for mode in "${MODES[@]}"; do s1[$mode]=$(sample "${addr[$mode]}" "${pid[$mode]}"); done
    sleep $((DURATION - 3))
    for mode in "${MODES[@]}"; do s2[$mode]=$(sample "${addr[$mode]}" "${pid[$mode]}"); done
    for mode in "${MODES[@]}"; do wait "${bench[$mode]}" || true; done
    if [ -n "$capture_pid" ]; then wait "$capture_pid" || true; fi
    for mode in "${MODES[@]}"; do kill "${pid[$mode]}" 2>/dev/null || true; done
    for mode in "${MODES[@]}"; do wait "${pid[$mode]}" 2>/dev/null || true; done
    PIDS=()

    local samples
    samples=$(jq -r '.samples // "none"' "$WORK/r$round-capture/profile.json" 2>/dev/null || echo none)
    if has_mode capture; then
        echo "  round $((round + 1)): capture took $samples samples" >&2
    else
        echo "  round $((round + 1))" >&2
    fi
    for mode in "${MODES[@]}"; do
        local m1 c1 t1 m2 c2 t2 rate passed srate eff
        read -r m1 c1 t1 <<<"${s1[$mode]}"
        read -r m2 c2 t2 <<<"${s2[$mode]}"
        rate=$(jq -r '.acked_per_sec' "$WORK/r$round-$mode/report.json" 2>/dev/null || echo 0)
        passed=$(jq -r '.passed' "$WORK/r$round-$mode/report.json" 2>/dev/null || echo false)
        if [ "$passed" != true ]; then
            echo "round $((round + 1)) $mode: the bench's correctness check did not pass:" >&2
            tail -5 "$WORK/r$round-$mode/bench.log" >&2
        fi
        srate=$(awk -v a="$m1" -v b="$m2" -v s="$t1" -v e="$t2" 'BEGIN{print (b-a)/(e-s)}')
        eff=$(awk -v a="$m1" -v b="$m2" -v s="$c1" -v e="$c2" 'BEGIN{print (e>s)?(b-a)/(e-s):0}')
        printf '%s %s %s %s %s\n' "$round" "$mode" "$rate" "$srate" "$eff" >>"$WORK/results"
        printf '    %-8s bench %8.1f msgs/s  server %8.1f msgs/s  %8.1f msgs/cpu-s  passed=%s\n' \
            "$mode" "$rate" "$srate" "$eff" "$passed" >&2
    done
}

echo "diag-overhead: $ROUNDS rounds, ${#MODES[@]} servers side by side, $SENDERS senders x window" \
     "$WINDOW each, ${DURATION}s measured after ${WARMUP}s warmup, synchronous=$SYNC," \
     "pin=$PIN, capture ${CAPTURE_SECS}s" >&2
for round in $(seq 0 $((ROUNDS - 1))); do
    run_round "$round"
done

median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
# Per-round ratio of column c of mode m to plain's in the same round.
ratios() { # mode column
    awk -v m="$1" -v c="$2" '$2=="plain"{b[$1]=$c} $2==m{v[$1]=$c} END{for (r in v) if (b[r]>0) print v[r]/b[r]}' "$WORK/results"
}
printf '\n%-9s %13s %13s %14s   %s\n' mode bench_ratio server_ratio per_cpu_ratio \
    "median bench msgs/s, server msgs/s, msgs/cpu-s"
for m in "${MODES[@]}"; do
    printf '%-9s %13.4f %13.4f %14.4f   %.1f %.1f %.1f\n' "$m" \
        "$(ratios "$m" 3 | median)" "$(ratios "$m" 4 | median)" "$(ratios "$m" 5 | median)" \
        "$(awk -v m="$m" '$2==m{print $3}' "$WORK/results" | median)" \
        "$(awk -v m="$m" '$2==m{print $4}' "$WORK/results" | median)" \
        "$(awk -v m="$m" '$2==m{print $5}' "$WORK/results" | median)"
done
echo
echo "runs (round mode bench_msgs_s server_msgs_s msgs_per_cpu_s):"
cat "$WORK/results"
