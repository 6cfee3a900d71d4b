#!/usr/bin/env bash
# heap-overhead.sh: what the heap profiler costs, compiled in and inactive, and while a
# capture samples.
#
# Each round starts three fresh im-servers side by side and loads each with its own
# `im-bench chat` at the same time, so all see the same machine conditions:
#   noprof     SERVER_NOPROF: im-server built with `--no-default-features` (jemalloc
#              without its profiler, no malloc_conf)
#   inactive   SERVER: the default build (profiler compiled in, `prof_active:false`)
#   capture    SERVER while a heap profile (format=bundle) samples for most of the measured
#              window and its report is built
# All servers share CPU 0 and all benches CPU 1 (PIN=0 turns pinning off), so the
# servers are CPU-bound and compete on equal terms. Per server, over the middle of the
# measured window: accepted msgs/s and messages per server CPU-second; the report gives,
# per mode, the median over rounds of its ratio to `noprof` in the same round, and the
# server CPU microseconds per message.
#
# Build both binaries first:
#   cargo build --release -p im-server --no-default-features
#   cp target/release/im-server target/release/im-server-noprof
#   cargo build --release -p im-server -p im-bench
# Usage: bench/scripts/heap-overhead.sh   (env: ROUNDS DURATION WARMUP SENDERS WINDOW
#        SYNC PIN PORT_BASE SERVER SERVER_NOPROF BENCH; defaults in side-by-side.sh and below)
set -euo pipefail

# shellcheck source=side-by-side.sh
. "$(dirname "$0")/side-by-side.sh"
side_by_side_defaults
PORT_BASE=${PORT_BASE:-28070}
MODES=(noprof inactive capture)
SECRET=heap-bench-secret-of-at-least-32-bytes
TOKEN=heap-bench-admin-of-at-least-32-bytes
CAPTURE_SECS=$((DURATION - 4))

for bin in "$SERVER" "$SERVER_NOPROF" "$BENCH"; do
    [ -x "$bin" ] || { echo "missing $bin: see the build commands at the top" >&2; exit 2; }
done
WORK_NAME=im-heap-bench
side_by_side_setup

mode_server() { # MODE: the mode's binary (see start_servers)
    if [ "$1" = noprof ]; then bin=$SERVER_NOPROF; fi
}

run_round() { # round
    local round=$1
    declare -A addr pid bench s1 s2
    start_servers 10
    start_benches 10
    start_capture heap
    local capture_pid=$!

    measure
    wait "$capture_pid" || true
    stop_servers

    local samples
    samples=$(jq -r '"\(.stacks) stacks, \(.inuse_bytes) bytes in use"' "$WORK/r$round-capture/profile.json" 2>/dev/null || echo none)
    echo "  round $((round + 1)): capture: $samples" >&2
    record_round
}

run_rounds heap-overhead

printf '\n%-9s %13s %13s %14s   %s\n' mode bench_ratio server_ratio per_cpu_ratio \
    "median bench msgs/s, server msgs/s, msgs/cpu-s, server CPU us/msg"
for m in "${MODES[@]}"; do
    eff=$(column "$m" 5)
    printf '%-9s %13.4f %13.4f %14.4f   %.1f %.1f %.1f %.2f\n' "$m" \
        "$(ratios noprof "$m" 3 | median)" "$(ratios noprof "$m" 4 | median)" \
        "$(ratios noprof "$m" 5 | median)" "$(column "$m" 3)" "$(column "$m" 4)" \
        "$eff" "$(awk -v e="$eff" 'BEGIN{print (e>0)?1e6/e:0}')"
done
echo
echo "runs (round mode bench_msgs_s server_msgs_s msgs_per_cpu_s):"
cat "$WORK/results"
