#!/usr/bin/env bash
# Where an idle connection's bytes go: one release im-server (default config, fresh
# data dir) with jemalloc sampling every 2^LG bytes (`_RJEM_MALLOC_CONF`, so the
# profile sees every per-connection allocation, not one in 512 KiB), a heap capture
# (`GET /admin/v1/profile/heap`) running while `im-bench peer idle --protocol im` opens
# N authenticated connections and holds them, and /admin/v1/memory plus /proc RSS read
# before the first connection and while they are held. Prints the per-connection bytes
# of each allocation site (pprof `-top -lines`, divided by N) and heap vs RSS.
# Usage: cargo build --release -p im-server -p im-bench && bench/scripts/idle-profile.sh
#   env: N (10000), LG (12), SECS (40: the capture and the hold), PORT (27170; admin on
#        PORT+1), PROFILE (1; 0: no capture and no sampling, for heap and RSS as they are
#        without the profiler's own records), SERVER (the binary), OUT (a directory to
#        keep heap.pb.gz, the pprof lists and the JSON in).
set -euo pipefail
cd "$(dirname "$0")/../.."
T="${CARGO_TARGET_DIR:-target}/release"
SERVER="${SERVER:-$T/im-server}"
N="${N:-10000}"
LG="${LG:-12}"
SECS="${SECS:-40}"
PROFILE="${PROFILE:-1}"
PORT="${PORT:-27170}"
SECRET=im-bench-secret-of-at-least-32-bytes
TOKEN=idle-profile-admin-of-at-least-32-bytes
WORK=$(mktemp -d)
OUT="${OUT:-$WORK}"
mkdir -p "$OUT"
DATA="$WORK/data"
mkdir -p "$DATA"
ADMIN="http://127.0.0.1:$((PORT + 1))"
cleanup() {
  [[ -n "${SPID:-}" ]] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
  rm -rf "$DATA"
}
trap cleanup EXIT
IM_LISTEN="127.0.0.1:$PORT" IM_ADMIN_LISTEN="127.0.0.1:$((PORT + 1))" IM_DATA_DIR="$DATA" \
  IM_JWT_SECRET="$SECRET" IM_ADMIN_TOKEN="$TOKEN" \
  _RJEM_MALLOC_CONF="$( ((PROFILE)) && echo "lg_prof_sample:$LG")" \
  "$SERVER" >"$OUT/server.log" 2>&1 &
SPID=$!
for _ in $(seq 100); do
  curl -sf -H "authorization: Bearer $TOKEN" "$ADMIN/admin/v1/memory" >/dev/null 2>&1 && break
  sleep 0.2
done
rss() { awk '/^VmRSS/ {print $2 * 1024}' "/proc/$SPID/status"; }
mem() { curl -sf -H "authorization: Bearer $TOKEN" "$ADMIN/admin/v1/memory"; }
sleep 2
mem >"$OUT/memory-before.json"
RSS0=$(rss)
CURL=
if ((PROFILE)); then
  curl -sf -H "authorization: Bearer $TOKEN" \
    "$ADMIN/admin/v1/profile/heap?seconds=$SECS&format=pprof" -o "$OUT/heap.pb.gz" &
  CURL=$!
fi
sleep 1
"$T/im-bench" peer idle --protocol im --url "ws://127.0.0.1:$PORT/ws" --server-pid "$SPID" \
  --connections "$N" --warmup 3s --duration "$((SECS - 5))s" --json >"$OUT/bench.json" &
BENCH=$!
# Read while every connection is held (the bench's hold ends after the capture).
sleep "$((SECS - 3))"
mem >"$OUT/memory-held.json"
RSS1=$(rss)
[[ -n "$CURL" ]] && wait "$CURL"
wait "$BENCH" || true
python3 - "$OUT" "$N" "$RSS0" "$RSS1" <<'PY'
import json, sys
out, n, r0, r1 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
b, h = json.load(open(f"{out}/memory-before.json")), json.load(open(f"{out}/memory-held.json"))
def pick(d, k):
    return d.get(k)
print(f"RSS {r0} -> {r1}: {(r1 - r0) / n:.0f} B per connection")
for k in ("allocated", "active", "resident", "metadata", "fragmentation", "dirty", "mapped"):
    a, z = pick(b, k), pick(h, k)
    if a is not None and z is not None:
        print(f"jemalloc {k} {a} -> {z}: {(z - a) / n:.0f} B per connection")
try:
    r = json.load(open(f"{out}/bench.json"))
    print("bench passed:", r.get("passed"), "open at end:", r.get("open_at_end"))
except Exception as e:
    print("bench report:", e)
PY
if ((PROFILE)); then
  go tool pprof -top -lines -nodecount=60 "$OUT/heap.pb.gz" >"$OUT/top-lines.txt" 2>/dev/null || true
  go tool pprof -raw "$OUT/heap.pb.gz" >"$OUT/raw.txt" 2>/dev/null || true
  python3 bench/scripts/heap-sites.py "$OUT/raw.txt" "$N" >"$OUT/sites.txt" && head -45 "$OUT/sites.txt"
fi
echo "kept in $OUT"
