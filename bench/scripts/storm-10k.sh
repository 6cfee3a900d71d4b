#!/usr/bin/env bash
# The broadcast storm at the field report's group size (BENCHMARKS.md, "Broadcast storm at
# 10,000 members, three nodes"): three release im-server nodes in cluster mode (the local
# Postgres with a fresh schema, the local NATS with a fresh prefix), NGROUPS groups of
# MEMBERS members at RATE msg/s each (above the 2,000-member notify_group_threshold:
# notify-and-pull), every member online, members spread round robin over the three nodes,
# the senders on n0. One process may hold 20,000 descriptors here, so each group gets its
# own im-bench process (`broadcast --groups 1`); they start sending at the same
# `--start-at` and measure the same window. ROUNDS rounds on the same cluster, the JSON
# kept in OUT, with each generator's progress and errors (roundR.genG.err). Per round:
# delivery P50/P99 (of each process, and the higher one, which bounds the merged P99 from
# above), deliveries/s, missing and duplicates, per node the CPU over the measured window
# (/proc, in cores) and RSS at its end, each generator's CPU; then the medians.
# Cleans up after itself: the generators and nodes by PID, the schema, the NATS KV buckets.
# Usage: cargo build --release -p im-server -p im-bench && bench/scripts/storm-10k.sh
#   env: ROUNDS (3), NGROUPS (2, groups), MEMBERS (10000), RATE (5), WARMUP (10, seconds),
#        DUR (30, seconds), CONNECT_SECS (60: time allowed to open every connection),
#        BASE_PORT (37070: node i listens on BASE_PORT+10i, admin on BASE_PORT+10i+1),
#        OUT (bench/results/storm-10k), IM_TEST_DATABASE_URL, IM_TEST_NATS_URL,
#        SERVER_ENV (extra KEY=VALUE words for every node, e.g. "IM_LOG=info").
set -euo pipefail
cd "$(dirname "$0")/../.."
T="${CARGO_TARGET_DIR:-target}/release"
NODES=3
ROUNDS="${ROUNDS:-3}"
NGROUPS="${NGROUPS:-2}"
MEMBERS="${MEMBERS:-10000}"
RATE="${RATE:-5}"
WARMUP="${WARMUP:-10}"
DUR="${DUR:-30}"
CONNECT_SECS="${CONNECT_SECS:-60}"
BASE_PORT="${BASE_PORT:-37070}"
OUT="${OUT:-bench/results/storm-10k}"
SERVER_ENV="${SERVER_ENV:-}"
PG="${IM_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
NATS="${IM_TEST_NATS_URL:-nats://127.0.0.1:4222}"
ID="storm10k$(date +%s)"
SECRET=storm-10k-secret-of-at-least-32-bytes
TOKEN=storm-10k-admin-of-at-least-32-bytes

# One generator process holds one group's MEMBERS connections; a node holds a third of
# them all.
ulimit -n "$(ulimit -Hn)"
if (( MEMBERS + 100 > $(ulimit -n) )); then
  echo "storm-10k: $MEMBERS connections do not fit in one process's $(ulimit -n) descriptors" >&2
  exit 2
fi
source bench/scripts/cluster-lib.sh
cluster_preflight "$T" "$NODES" "$BASE_PORT"

WORK=$(mktemp -d)
mkdir -p "$OUT"
node_pids=()
gen_pids=()
cleanup() {
  cluster_teardown "$PG" "$ID" "$NATS" "${gen_pids[@]}" "${node_pids[@]}"
  # The last lines of each node's log (WARN and up; a store in trouble logs a lot).
  for f in "$WORK"/n*.log; do [[ -e "$f" ]] && tail -n 200 "$f" >"$OUT/$(basename "$f")"; done
  rm -rf "$WORK"
}
trap cleanup EXIT
psql "$PG" -qc "CREATE SCHEMA $ID"

# shellcheck disable=SC2086 # SERVER_ENV is a list of words
start_nodes $SERVER_ENV
sleep 3

# CPU seconds (user + system) of every node (or of the PIDs given), one line
# "pid seconds" each.
cpu_now() {
  local tck pids=("$@")
  tck=$(getconf CLK_TCK)
  (( ${#pids[@]} )) || pids=("${node_pids[@]}")
  for p in "${pids[@]}"; do
    # A process that is gone (a generator that ended its drain early, or failed) has no
    # line: it is left out of the CPU figures, and its report says how it ended.
    [[ -r "/proc/$p/stat" ]] || continue
    awk -v p="$p" -v t="$tck" '{ sub(/^.*\) /, ""); print p, ($12 + $13) / t }' "/proc/$p/stat"
  done
}
rss_now() {
  for p in "${node_pids[@]}"; do
    [[ -r "/proc/$p/status" ]] || continue
    awk -v p="$p" '/^VmRSS:/ { print p, $2 * 1024 }' "/proc/$p/status"
  done
}

echo "storm-10k: $NGROUPS groups x $MEMBERS members at $RATE msg/s on $NODES nodes, warmup ${WARMUP}s, ${DUR}s measured, $ROUNDS rounds (schema and prefix $ID, JSON in $OUT)"
node_urls=$(for i in $(seq 1 $((NODES - 1))); do ws "$i"; done | paste -sd,)
node_admins=$(for i in $(seq 1 $((NODES - 1))); do admin "$i"; done | paste -sd,)
rc=0
for r in $(seq "$ROUNDS"); do
  start=$(( $(date +%s) + CONNECT_SECS ))
  gen_pids=()
  for g in $(seq 0 $((NGROUPS - 1))); do
    "$T/im-bench" broadcast --url "$(ws 0)" --node-url "$node_urls" \
      --admin-url "$(admin 0)" --node-admin-url "$node_admins" --admin-token "$TOKEN" \
      --secret "$SECRET" --groups 1 --members "$MEMBERS" --rate "$RATE" --pull \
      --warmup "${WARMUP}s" --duration "${DUR}s" --start-at "$start" --json \
      >"$OUT/round$r.gen$g.json" 2>"$OUT/round$r.gen$g.err" &
    gen_pids+=($!)
  done
  sleep $(( start + WARMUP - $(date +%s) )) 2>/dev/null || true
  cpu_now >"$OUT/round$r.cpu0"
  cpu_now "${gen_pids[@]}" >"$OUT/round$r.gencpu0"
  sleep $(( start + WARMUP + DUR - $(date +%s) )) 2>/dev/null || true
  cpu_now >"$OUT/round$r.cpu1"
  cpu_now "${gen_pids[@]}" >"$OUT/round$r.gencpu1"
  rss_now >"$OUT/round$r.rss"
  for g in "${!gen_pids[@]}"; do
    wait "${gen_pids[$g]}" || { echo "storm-10k: round $r generator $g failed" >&2; tail -5 "$OUT/round$r.gen$g.err" >&2; rc=1; }
  done
  gen_pids=()
  python3 - "$OUT" "$r" "$NGROUPS" "$DUR" <<'PY'
import json, sys
out, r, groups, dur = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
gens = []
for g in range(groups):
    try:
        gens.append(json.load(open(f"{out}/round{r}.gen{g}.json")))
    except (OSError, ValueError):
        print(f"round {r}: generator {g}: no report")
def load_pairs(name):
    return dict(line.split() for line in open(f"{out}/round{r}.{name}"))
c0, c1, rss = load_pairs("cpu0"), load_pairs("cpu1"), load_pairs("rss")
ms = lambda us: us / 1000
for g, j in enumerate(gens):
    d = j["delivery_us"]
    v = j.get("correctness", {})
    print(f"round {r} gen {g}: delivery p50 {ms(d['p50']):7.1f} ms  p99 {ms(d['p99']):7.1f} ms  p999 {ms(d['p999']):7.1f} ms"
          f"  {j['deliveries_per_sec']:8.0f} deliveries/s  observed {j['observed_mode']}"
          f"  missing {v.get('missing')} duplicates {v.get('duplicates')}  passed {j['passed']}")
summary = {"round": int(r)}
if gens:
    summary.update(
        p50_ms=max(ms(j["delivery_us"]["p50"]) for j in gens),
        p99_ms=max(ms(j["delivery_us"]["p99"]) for j in gens),
        deliveries_per_sec=sum(j["deliveries_per_sec"] for j in gens),
        missing=sum(j.get("correctness", {}).get("missing", 0) for j in gens),
        duplicates=sum(j.get("correctness", {}).get("duplicates", 0) for j in gens),
        passed=all(j["passed"] for j in gens) and len(gens) == groups,
    )
nodes = []
for i, pid in enumerate(c0):
    if pid not in c1 or pid not in rss:
        print(f"round {r}: node n{i} (pid {pid}) was gone at the window's end")
        continue
    cores = (float(c1[pid]) - float(c0[pid])) / dur
    nodes.append({"node": f"n{i}", "cpu_cores": cores, "rss_mib": int(rss[pid]) / 2**20})
summary["nodes"] = nodes
try:
    g0, g1 = load_pairs("gencpu0"), load_pairs("gencpu1")
    summary["generators_cpu_cores"] = [(float(g1[p]) - float(g0[p])) / dur for p in g0 if p in g1]
except OSError:
    pass
print(f"round {r}: delivery p50 {summary.get('p50_ms', 0):.1f} ms, p99 {summary.get('p99_ms', 0):.1f} ms (the higher process's), "
      f"{summary.get('deliveries_per_sec', 0):.0f} deliveries/s, missing {summary.get('missing')}, duplicates {summary.get('duplicates')}, passed {summary.get('passed')}")
print(f"round {r}: " + "  ".join(f"{n['node']} CPU {n['cpu_cores']:.2f} cores RSS {n['rss_mib']:.0f} MiB" for n in nodes)
      + "  generators " + " / ".join(f"{c:.2f}" for c in summary.get("generators_cpu_cores", [])) + " cores")
if gens:
    for node in gens[0].get("nodes", []):
        f = node.get("server") or {}
        st = {s["stage"]: s for s in f.get("stages", []) if s.get("count")}
        text = "  ".join(f"{k} p99 {s['p99_us'] / 1000:.1f}" for k, s in st.items())
        print(f"round {r} stages {node['url']}: {text}")
json.dump(summary, open(f"{out}/round{r}.summary.json", "w"))
PY
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rs = []
for r in range(1, rounds + 1):
    try:
        rs.append(json.load(open(f"{out}/round{r}.summary.json")))
    except (OSError, ValueError):
        pass
rs = [s for s in rs if "p99_ms" in s]
if not rs:
    sys.exit("storm-10k: no round finished")
med = lambda k: statistics.median(s[k] for s in rs)
print()
print(f"median of {len(rs)}: delivery p50 {med('p50_ms'):.1f} ms, p99 {med('p99_ms'):.1f} ms "
      f"({' / '.join('%.1f' % s['p99_ms'] for s in rs)}), {med('deliveries_per_sec'):.0f} deliveries/s, "
      f"missing {sum(s['missing'] for s in rs)}, duplicates {sum(s['duplicates'] for s in rs)}, "
      f"all passed {all(s['passed'] for s in rs)}")
for i in range(len(rs[0]["nodes"])):
    cpu = statistics.median(s["nodes"][i]["cpu_cores"] for s in rs)
    rss = statistics.median(s["nodes"][i]["rss_mib"] for s in rs)
    print(f"median n{i}: CPU {cpu:.2f} cores, RSS {rss:.0f} MiB")
PY
exit $rc
