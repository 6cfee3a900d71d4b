#!/usr/bin/env bash
# The field report's headline in one run (BENCHMARKS.md, "The field report's headline"):
# three release im-server nodes in cluster mode (the local Postgres with a fresh schema,
# the local NATS with a fresh prefix) hold ~47,000 idle authenticated connections (one
# `im-bench idle` per node, IDLE_PER_NODE each) and, while they are held, one
# `im-bench mix` per rate step puts mixed traffic on the cluster: USERS more users spread
# over the three nodes (user i on node i % 3), one-to-one conversations between random
# pairs and GROUP_COUNT groups of GROUP_MEMBERS random users (so most conversations and every
# group span nodes), GROUP_SHARE of the messages to groups, the report's size mix. With
# the defaults 50,100 connections are online during every step.
#
# Per step it keeps the mix report (send->ack and send->deliver P50/P99 over all
# messages, per class and for groups; acked and delivered; the exactly-once verdict;
# refusals by code), each node's /admin/v1/overview in the middle of the step
# (connections, RSS) and the CPU seconds each process used during the step (the three
# nodes, Postgres, NATS, the generators), from /proc. At the end it prints one table,
# writes summary.json, stops what it started (by PID), drops the schema and deletes the
# NATS KV buckets it created.
#
# Usage: cargo build --release -p im-server -p im-bench && flock /tmp/bench.lock bench/scripts/headline.sh
#   env: RATES ("5000 10000 15000" msg/s, one step each), STEP (20s measured), WARMUP (5s),
#        IDLE_PER_NODE (15700), RAMP (45s), USERS (3000), CONVERSATIONS (3000), ZIPF (0.6),
#        GROUP_COUNT (100), GROUP_MEMBERS (20), GROUP_SHARE (0.2),
#        MIX (text:90:50-500,image:8:5000-20000,file:2:20000-50000), BASE_PORT (28070),
#        IM_TEST_DATABASE_URL, IM_TEST_NATS_URL, OUT (bench/results/headline/<time>).
set -euo pipefail
cd "$(dirname "$0")/../.."
T="${CARGO_TARGET_DIR:-target}/release"
NODES=3
RATES="${RATES:-5000 10000 15000}"
STEP="${STEP:-20s}"
WARMUP="${WARMUP:-5s}"
IDLE_PER_NODE="${IDLE_PER_NODE:-15700}"
RAMP="${RAMP:-45s}"
USERS="${USERS:-3000}"
CONVERSATIONS="${CONVERSATIONS:-$USERS}"
ZIPF="${ZIPF:-0.6}"
GROUP_COUNT="${GROUP_COUNT:-100}"
GROUP_MEMBERS="${GROUP_MEMBERS:-20}"
GROUP_SHARE="${GROUP_SHARE:-0.2}"
MIX="${MIX:-text:90:50-500,image:8:5000-20000,file:2:20000-50000}"
BASE_PORT="${BASE_PORT:-28070}"
PG="${IM_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
NATS="${IM_TEST_NATS_URL:-nats://127.0.0.1:4222}"
ID="headline$(date +%s)"
OUT="${OUT:-bench/results/headline/$(date -u +%Y%m%dT%H%M%SZ)}"
SECRET=headline-secret-of-at-least-32-bytes
TOKEN=headline-admin-of-at-least-32-bytes
secs() { [[ "$1" =~ ^([0-9]+)s$ ]] && echo "${BASH_REMATCH[1]}" || { echo "headline: durations in whole seconds (e.g. 20s), not $1" >&2; exit 2; }; }
STEP_S=$(secs "$STEP"); WARMUP_S=$(secs "$WARMUP"); RAMP_S=$(secs "$RAMP")
read -ra rates <<<"$RATES"
# Each step: connecting and creating groups (~10 s), warmup, measure, drain (up to 20 s).
HOLD_S=$(( ${#rates[@]} * (WARMUP_S + STEP_S + 40) + 20 ))

# The load stays bounded: at most 51,000 connections in all, at most 19,000 per process
# (RLIMIT_NOFILE is 20,000 here) and per node.
total=$(( NODES * IDLE_PER_NODE + USERS ))
per_node=$(( IDLE_PER_NODE + (USERS + NODES - 1) / NODES ))
if (( total > 51000 || per_node > 19000 || USERS > 19000 )); then
  echo "headline: $total connections ($per_node per node) is over the bound (51,000 total, 19,000 per process)" >&2
  exit 2
fi
ulimit -n "$(ulimit -Hn)"
source bench/scripts/cluster-lib.sh
cluster_preflight "$T" "$NODES" "$BASE_PORT"

WORK=$(mktemp -d)
mkdir -p "$OUT"
node_pids=()
idle_pids=()
mix_pid=""
cleanup() {
  cluster_teardown "$PG" "$ID" "$NATS" $mix_pid "${idle_pids[@]}" "${node_pids[@]}"
  cp "$WORK"/*.log "$WORK"/*.err "$OUT"/ 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
psql "$PG" -qc "CREATE SCHEMA $ID"

overview() { curl -sf -m 10 -H "Authorization: Bearer $TOKEN" "$(admin "$1")/admin/v1/overview"; }
start_nodes
sleep 3

# CPU ticks used so far by each process of interest (the nodes and generators by PID;
# Postgres and NATS by command name, all their processes), and the machine's busy ticks.
cpu_snapshot() { # label
  python3 - "$OUT/cpu.$1.json" "${node_pids[*]}" "${idle_pids[*]:-}" "${mix_pid:-}" <<'PY'
import json, os, sys, time
out, nodes, idles, mix = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split()
def ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0
def by_name(name):
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == name:
                    total += ticks(pid)
        except OSError:
            pass
    return total
with open("/proc/stat") as f:
    cpu = [int(x) for x in f.readline().split()[1:]]
snap = {
    "t": time.time(),
    "hz": os.sysconf("SC_CLK_TCK"),
    "nodes": [ticks(p) for p in nodes],
    "idle_generators": sum(ticks(p) for p in idles),
    "mix_generator": sum(ticks(p) for p in mix),
    "postgres": by_name("postgres"),
    "nats": by_name("nats-server"),
    "machine_busy": sum(cpu) - cpu[3] - cpu[4],
    "machine_all": sum(cpu),
}
json.dump(snap, open(out, "w"))
PY
}

echo "headline: $NODES nodes x $IDLE_PER_NODE idle connections (ramp $RAMP, hold ${HOLD_S}s) + $USERS mix users; steps $RATES msg/s; schema and prefix $ID; results in $OUT"
start=$(date +%s)
for i in $(seq 0 $((NODES - 1))); do
  "$T/im-bench" idle --url "$(ws "$i")" --admin-url "$(admin "$i")" --admin-token "$TOKEN" \
    --secret "$SECRET" --connections "$IDLE_PER_NODE" --ramp "$RAMP" --duration "${HOLD_S}s" \
    --json >"$OUT/idle$i.json" 2>"$WORK/idle$i.err" &
  idle_pids+=($!)
done
deadline=$((start + RAMP_S + 120))
while :; do
  full=0
  counts=""
  for i in $(seq 0 $((NODES - 1))); do
    c=$(overview "$i" | jq -r '.connections' || echo 0)
    counts+=" n$i=$c"
    (( c >= IDLE_PER_NODE )) && full=$((full + 1))
  done
  echo "headline: ramp $(( $(date +%s) - start ))s:$counts"
  (( full == NODES )) && break
  for p in "${idle_pids[@]}"; do
    kill -0 "$p" 2>/dev/null || { echo "headline: an idle generator ended before every node was full" >&2; tail -5 "$WORK"/idle*.err >&2; exit 1; }
  done
  (( $(date +%s) < deadline )) || { echo "headline: the nodes were not full in time" >&2; exit 1; }
  sleep 5
done
hold_end=$(( $(date +%s) + HOLD_S ))
sleep 3
for i in $(seq 0 $((NODES - 1))); do overview "$i" >"$OUT/n$i.idle.overview.json"; done

rc=0
for rate in "${rates[@]}"; do
  secs_left=$(( hold_end - $(date +%s) ))
  if (( secs_left < WARMUP_S + STEP_S + 25 )); then
    echo "headline: the idle hold ends in ${secs_left}s, too soon for the $rate msg/s step; skipped" >&2
    rc=1
    break
  fi
  echo "headline: step $rate msg/s"
  "$T/im-bench" mix --url "$(ws 0)" --node-url "$(ws 1),$(ws 2)" --admin-url "$(admin 0)" \
    --admin-token "$TOKEN" --secret "$SECRET" --users "$USERS" --conversations "$CONVERSATIONS" \
    --zipf "$ZIPF" --rate "$rate" --mix "$MIX" --groups "$GROUP_COUNT" --group-members "$GROUP_MEMBERS" \
    --group-share "$GROUP_SHARE" --read-share 0 --typing-share 0 --list-rate 0 \
    --warmup "$WARMUP" --duration "$STEP" --drain 10s --json >"$OUT/step$rate.json" 2>"$WORK/step$rate.err" &
  mix_pid=$!
  # The measured window starts once the users are connected and the groups created:
  # wait for the generator's first progress line, then sample around the window.
  for _ in $(seq 120); do grep -q "acked" "$WORK/step$rate.err" 2>/dev/null && break; kill -0 "$mix_pid" 2>/dev/null || break; sleep 0.5; done
  # (The first line comes after the first second of the warmup, give or take the polling:
  # sample from ~1 s into the window to ~3 s before its end, while the generator runs.)
  sleep "$WARMUP_S"
  cpu_snapshot "$rate.begin"
  # What the database's sessions wait on, five times a second apart (lock waits between
  # the nodes' commits show as Lock/transactionid or Lock/tuple, the disk as IO/WALSync).
  for _ in 1 2 3 4 5; do
    psql "$PG" -AtF' ' -c "SELECT coalesce(wait_event_type, 'CPU'), coalesce(wait_event, '-'), state, count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND query NOT LIKE '%pg_stat_activity%' GROUP BY 1, 2, 3 ORDER BY 4 DESC" || true
    sleep 1
  done >"$OUT/pg_waits.$rate.txt" 2>/dev/null &
  sleep $(( STEP_S / 2 ))
  for i in $(seq 0 $((NODES - 1))); do overview "$i" >"$OUT/n$i.step$rate.overview.json" || echo '{}' >"$OUT/n$i.step$rate.overview.json"; done
  sleep $(( STEP_S - STEP_S / 2 - 4 ))
  cpu_snapshot "$rate.end"
  wait "$mix_pid" || { echo "headline: mix at $rate msg/s did not pass (exit $?)" >&2; tail -30 "$WORK/step$rate.err" >&2; rc=1; }
  mix_pid=""
done

echo "headline: waiting for the idle generators' hold to end ($(( hold_end - $(date +%s) ))s)"
for i in "${!idle_pids[@]}"; do
  wait "${idle_pids[$i]}" || { echo "headline: idle generator $i failed" >&2; tail -20 "$WORK/idle$i.err" >&2; rc=1; }
done
idle_pids=()

python3 - "$OUT" "$NODES" "${rates[*]}" <<'PY'
import json, sys
out, nodes, rates = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def load(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default
MiB = 1024 * 1024
ms = lambda s, k: (s or {}).get(k, 0) / 1000
rows = []
for r in rates:
    m = load(f"{out}/step{r}.json")
    c0, c1 = load(f"{out}/cpu.{r}.begin.json"), load(f"{out}/cpu.{r}.end.json")
    ovs = [load(f"{out}/n{i}.step{r}.overview.json", {}) for i in range(nodes)]
    if m is None:
        rows.append({"rate": int(r), "error": "no report"})
        continue
    cpu = {}
    if c0 and c1:
        dt = (c1["t"] - c0["t"]) * c0["hz"]
        pct = lambda a, b: round(100.0 * (b - a) / dt, 1)
        cpu = {
            "nodes": [pct(a, b) for a, b in zip(c0["nodes"], c1["nodes"])],
            "postgres": pct(c0["postgres"], c1["postgres"]),
            "nats": pct(c0["nats"], c1["nats"]),
            # None when the generator had ended before the second reading.
            "mix_generator": pct(c0["mix_generator"], c1["mix_generator"]) if c1["mix_generator"] else None,
            "idle_generators": pct(c0["idle_generators"], c1["idle_generators"]),
            "machine_busy_of_2_cores": round(100.0 * (c1["machine_busy"] - c0["machine_busy"]) / (c1["machine_all"] - c0["machine_all"]), 1),
        }
    v = m.get("correctness", {})
    errors = m.get("errors", {})
    row = {
        "rate": int(r),
        "acked_per_sec": round(m["acked_per_sec"], 1),
        "acked_bytes_per_sec": round(m["acked_bytes_per_sec"]),
        "send_to_ack_ms": {"p50": ms(m["send_to_ack_us"], "p50"), "p99": ms(m["send_to_ack_us"], "p99")},
        "send_to_deliver_ms": {"p50": ms(m["send_to_deliver_us"], "p50"), "p99": ms(m["send_to_deliver_us"], "p99")},
        "group_send_to_deliver_ms": {"p50": ms(m["group"]["send_to_deliver_us"], "p50"), "p99": ms(m["group"]["send_to_deliver_us"], "p99")},
        "classes_p99_ms": {c["name"]: [ms(c["send_to_ack_us"], "p99"), ms(c["send_to_deliver_us"], "p99")] for c in m["classes"]},
        "dispatched": m["dispatched"], "skipped": m["skipped_queue"] + m["skipped_window"], "retries": m["retries"],
        "acked": m["acked"], "delivered": m["delivered"], "group_delivered": m["group"]["delivered"], "group_pushes_reordered": m["group"].get("pushes_reordered"),
        "unacked_at_end": m["unacked_at_end"],
        "missing": v.get("missing"), "duplicates": v.get("duplicates"), "not_increasing": v.get("not_increasing"),
        "errors": errors, "disconnects": m.get("disconnects", {}),
        "passed": m.get("passed"),
        "connections": [o.get("connections") for o in ovs],
        "rss_mib": [round(o.get("process", {}).get("rss_bytes", 0) / MiB, 1) for o in ovs],
        "cpu_pct": cpu,
    }
    rows.append(row)
idle = [load(f"{out}/idle{i}.json", {}) for i in range(nodes)]
summary = {
    "steps": rows,
    "idle": [{k: g.get(k) for k in ("established", "failed", "dropped", "passed")} for g in idle],
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print()
print(f"{'offered':>8} {'acked/s':>8} {'online':>7} {'ack p50':>8} {'ack p99':>8} {'dlv p50':>8} {'dlv p99':>8} {'grp dlv p99':>11} {'missing':>7} {'dup':>4} {'refused':>7}  cpu% n0/n1/n2 pg nats gen (machine)")
for row in rows:
    if "error" in row:
        print(f"{row['rate']:>8} {row['error']}")
        continue
    c = row["cpu_pct"]
    online = sum(x or 0 for x in row["connections"])
    refused = sum(row["errors"].values()) if isinstance(row["errors"], dict) else row["errors"]
    cpu = (f"{'/'.join(str(x) for x in c['nodes'])} {c['postgres']} {c['nats']} {(c['mix_generator'] or 0) + c['idle_generators']:.1f} ({c['machine_busy_of_2_cores']}%)" if c else "-")
    print(f"{row['rate']:>8} {row['acked_per_sec']:>8.0f} {online:>7} {row['send_to_ack_ms']['p50']:>8.1f} {row['send_to_ack_ms']['p99']:>8.1f} "
          f"{row['send_to_deliver_ms']['p50']:>8.1f} {row['send_to_deliver_ms']['p99']:>8.1f} {row['group_send_to_deliver_ms']['p99']:>11.1f} "
          f"{row['missing']!s:>7} {row['duplicates']!s:>4} {refused!s:>7}  {cpu}  passed {row['passed']}")
print()
for i, g in enumerate(summary["idle"]):
    print(f"idle generator n{i}: {g}")
PY
exit $rc
