# side-by-side.sh: what diag-overhead.sh and heap-overhead.sh share, sourced by both. They
# start one fresh im-server per mode side by side, load each with its own `im-bench chat`
# at the same time (so all see the same machine conditions), sample each server's
# accepted messages and CPU over the measured window, and report per mode the median over
# rounds of its ratio to a baseline mode in the same round.
#
# The sourcing script calls `side_by_side_defaults` (SERVER, SERVER_NOPROF, BENCH, ROUNDS,
# DURATION, WARMUP, SENDERS, WINDOW, SYNC, PIN), sets MODES (array), PORT_BASE, SECRET,
# TOKEN, CAPTURE_SECS and WORK_NAME, defines `mode_server`, then calls
# `side_by_side_setup`; a round's functions read the caller's `addr`, `pid` and `bench`
# maps and `round`.

side_by_side_defaults() { # the knobs both scripts share (env overrides each)
    ROOT=$(cd "$(dirname "$0")/../.." && pwd)
    SERVER=${SERVER:-$ROOT/target/release/im-server}
    SERVER_NOPROF=${SERVER_NOPROF:-$ROOT/target/release/im-server-noprof}
    BENCH=${BENCH:-$ROOT/target/release/im-bench}
    ROUNDS=${ROUNDS:-3}
    DURATION=${DURATION:-10}
    WARMUP=${WARMUP:-2}
    SENDERS=${SENDERS:-50}
    WINDOW=${WINDOW:-8}
    SYNC=${SYNC:-normal}
    PIN=${PIN:-1}
}

side_by_side_setup() { # checks the tools and makes $WORK (removed, with the servers, at exit)
    command -v jq >/dev/null || { echo "needs jq" >&2; exit 2; }
    [ "$DURATION" -ge 6 ] || { echo "DURATION must be at least 6" >&2; exit 2; }
    WORK=$(mktemp -d -t "$WORK_NAME.XXXXXX")
    PIDS=()
    trap side_by_side_cleanup EXIT
}

side_by_side_cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}

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

start_server() { # MODE PORT BINARY [ENV=VALUE...]: one server of the round, pinned to CPU 0
    local mode=$1 port=$2 dir="$WORK/r$round-$1"
    mkdir -p "$dir"
    addr[$mode]=127.0.0.1:$((port + 1))
    on_cpu 0 env IM_LISTEN=127.0.0.1:$port IM_ADMIN_LISTEN="${addr[$mode]}" \
        IM_DATA_DIR="$dir/data" IM_JWT_SECRET=$SECRET IM_ADMIN_TOKEN=$TOKEN IM_LOG=info \
        IM_STORE_SQLITE_SYNCHRONOUS="$SYNC" IM_LIMITS_SEND_RATE_PER_SEC=0 "${@:4}" \
        "$3" 2>"$dir/server.log" &
    pid[$mode]=$!
    PIDS+=("$!")
}

start_servers() { # STRIDE: starts one server per mode, each on its own ports, and waits
    # until all listen. The caller's `mode_server MODE` sets `bin` (the binary) and may
    # append ENV=VALUE words to `extra` for that mode.
    local k mode bin extra
    for k in "${!MODES[@]}"; do
        mode=${MODES[$k]}
        bin=$SERVER
        extra=()
        mode_server "$mode"
        start_server "$mode" $((PORT_BASE + $1 * round + 2 * k)) "$bin" "${extra[@]}"
    done
    await_servers
}

start_capture() { # KIND: captures a KIND profile (format=bundle) of the `capture` server
    # in the background from just after the warmup into the round's profile.json; `$!` is
    # its pid when this returns
    (sleep "$WARMUP.5"
     admin "${addr[capture]}" GET "/admin/v1/profile/$1?seconds=$CAPTURE_SECS&format=bundle" \
        >"$WORK/r$round-capture/profile.json") &
}

await_servers() { # waits until every server of the round listens
    local mode dir
    for mode in "${MODES[@]}"; do
        dir="$WORK/r$round-$mode"
        for _ in $(seq 100); do
            grep -q "listening client=" "$dir/server.log" 2>/dev/null && break
            sleep 0.1
        done
        grep -q "listening client=" "$dir/server.log" || { cat "$dir/server.log" >&2; exit 2; }
    done
}

start_benches() { # STRIDE: one chat bench per server, in a rotating order (no mode always first)
    local j i k mode port
    for j in "${!MODES[@]}"; do
        mode=${MODES[$(((j + round) % ${#MODES[@]}))]}
        k=0; for i in "${!MODES[@]}"; do if [ "${MODES[$i]}" = "$mode" ]; then k=$i; fi; done
        port=$((PORT_BASE + $1 * round + 2 * k))
        on_cpu 1 "$BENCH" --threads 1 chat --url "ws://127.0.0.1:$port/ws" --secret "$SECRET" \
            --senders "$SENDERS" --window "$WINDOW" --duration "${DURATION}s" \
            --warmup "${WARMUP}s" --drain 5s --json \
            >"$WORK/r$round-$mode/report.json" 2>"$WORK/r$round-$mode/bench.log" &
        bench[$mode]=$!
    done
}

measure() { # samples every server over the measured window, then waits for the benches
    local mode
    sleep "$WARMUP.5"; sleep 1
    for mode in "${MODES[@]}"; do s1[$mode]=$(sample "${addr[$mode]}" "${pid[$mode]}"); done
    sleep $((DURATION - 3))
    for mode in "${MODES[@]}"; do s2[$mode]=$(sample "${addr[$mode]}" "${pid[$mode]}"); done
    for mode in "${MODES[@]}"; do wait "${bench[$mode]}" || true; done
}

stop_servers() {
    local mode
    for mode in "${MODES[@]}"; do kill "${pid[$mode]}" 2>/dev/null || true; done
    for mode in "${MODES[@]}"; do wait "${pid[$mode]}" 2>/dev/null || true; done
    PIDS=()
}

record_round() { # appends each mode's figures of the round to $WORK/results and prints them
    local mode m1 c1 t1 m2 c2 t2 rate passed srate eff
    for mode in "${MODES[@]}"; do
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

run_rounds() { # NAME: says what runs, then every round (the script's run_round)
    echo "$1: $ROUNDS rounds, ${#MODES[@]} servers side by side, $SENDERS senders x window" \
         "$WINDOW each, ${DURATION}s measured after ${WARMUP}s warmup, synchronous=$SYNC," \
         "pin=$PIN, capture ${CAPTURE_SECS}s" >&2
    local round
    for round in $(seq 0 $((ROUNDS - 1))); do
        run_round "$round"
    done
}

median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# Per-round ratio of column c of mode m to the baseline mode's in the same round.
ratios() { # BASELINE MODE COLUMN
    awk -v base="$1" -v m="$2" -v c="$3" \
        '$2==base{b[$1]=$c} $2==m{v[$1]=$c} END{for (r in v) if (b[r]>0) print v[r]/b[r]}' \
        "$WORK/results"
}

column() { # MODE COLUMN: the median of a column of the mode's rounds
    awk -v m="$1" -v c="$2" '$2==m{print $c}' "$WORK/results" | median
}
