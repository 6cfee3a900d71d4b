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
#        FILTERS SYNC PIN PORT_BASE SERVER BENCH MODES; defaults in side-by-side.sh and
#        below; MODES is a space-separated subset of the modes, `plain` included)
set -euo pipefail

# shellcheck source=side-by-side.sh
. "$(dirname "$0")/side-by-side.sh"
side_by_side_defaults
FILTERS=${FILTERS:-1000}
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
WORK_NAME=im-diag-bench
side_by_side_setup

mode_server() { # MODE: the mode's binary and settings (see start_servers)
    case $1 in
        plain) extra+=(IM_LOG_UID_FILTERS=false) ;;
        noprobes) extra+=(IM_OBS_PROBES=false) ;;
        nomonitors) extra+=(IM_OBS_TASK_MONITORS=false) ;;
        trace1k) extra+=(IM_OBS_TRACE_SAMPLE_RATE=0.001) ;;
        traceall) extra+=(IM_OBS_TRACE_SAMPLE_RATE=1) ;;
        noprof) bin=$SERVER_NOPROF ;;
    esac
}

run_round() { # round
    local round=$1
    declare -A addr pid bench s1 s2
    start_servers 20
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

    start_benches 20
    local capture_pid=
    if has_mode capture; then
        start_capture cpu
        capture_pid=$!
    fi

    measure
    if [ -n "$capture_pid" ]; then wait "$capture_pid" || true; fi
    stop_servers

    local samples
    samples=$(jq -r '.samples // "none"' "$WORK/r$round-capture/profile.json" 2>/dev/null || echo none)
    if has_mode capture; then
        echo "  round $((round + 1)): capture took $samples samples" >&2
    else
        echo "  round $((round + 1))" >&2
    fi
    record_round
}

run_rounds diag-overhead

printf '\n%-9s %13s %13s %14s   %s\n' mode bench_ratio server_ratio per_cpu_ratio \
    "median bench msgs/s, server msgs/s, msgs/cpu-s"
for m in "${MODES[@]}"; do
    printf '%-9s %13.4f %13.4f %14.4f   %.1f %.1f %.1f\n' "$m" \
        "$(ratios plain "$m" 3 | median)" "$(ratios plain "$m" 4 | median)" \
        "$(ratios plain "$m" 5 | median)" "$(column "$m" 3)" "$(column "$m" 4)" "$(column "$m" 5)"
done
echo
echo "runs (round mode bench_msgs_s server_msgs_s msgs_per_cpu_s):"
cat "$WORK/results"
