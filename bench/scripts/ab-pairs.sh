#!/usr/bin/env bash
# ab-pairs.sh: paced one-to-one cost (or a group's fan-out cost) of two im-server builds,
# side by side in one sitting.
#
# Each round runs `im-bench peer pairs` (PAIRS pairs x RATE msg/s each, every message
# acked after its durable commit and delivered once) or, with SCENARIO=broadcast,
# `im-bench peer broadcast` (one group of MEMBERS members, RATE msg/s into it) against a
# fresh server of build A, then of build B (`--spawn`: ephemeral loopback ports, a
# temporary SQLite data dir), and the order alternates between rounds so neither build
# always runs second. It prints, per build, the median over rounds of the server's CPU per
# message (pairs) or per delivery (broadcast), user + kernel read from /proc, and the
# send-to-ack (pairs) or delivery (broadcast) P99, and the ratio B / A of the CPU medians.
# A run that failed its exactly-once check is reported and left out.
#
# Usage: bench/scripts/ab-pairs.sh A_SERVER B_SERVER
#   env: BENCH (target/release/im-bench), SCENARIO (pairs | broadcast), ROUNDS (3),
#        PAIRS (100), MEMBERS (1000), RATE (10 for pairs, 50 for broadcast),
#        DURATION (10s), WARMUP (3s), OUT (a directory to keep each run's JSON and log in)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
A=${1:?usage: ab-pairs.sh A_SERVER B_SERVER}
B=${2:?usage: ab-pairs.sh A_SERVER B_SERVER}
BENCH=${BENCH:-${CARGO_TARGET_DIR:-$ROOT/target}/release/im-bench}
SCENARIO=${SCENARIO:-pairs}
ROUNDS=${ROUNDS:-3}
PAIRS=${PAIRS:-100}
MEMBERS=${MEMBERS:-1000}
case "$SCENARIO" in
  pairs) RATE=${RATE:-10}; LOAD=(--pairs "$PAIRS") ;;
  broadcast) RATE=${RATE:-50}; LOAD=(--members "$MEMBERS") ;;
  *) echo "ab-pairs: SCENARIO is pairs or broadcast, not '$SCENARIO'" >&2; exit 2 ;;
esac
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-3s}
for bin in "$A" "$B" "$BENCH"; do
  [[ -x "$bin" ]] || { echo "ab-pairs: $bin is missing or not executable" >&2; exit 2; }
done
OUT=${OUT:-$(mktemp -d -t im-ab-pairs.XXXXXX)}
mkdir -p "$OUT"

run() { # NAME SERVER
  local rc=0
  "$BENCH" peer "$SCENARIO" --protocol im --spawn "$2" "${LOAD[@]}" --rate "$RATE" \
    --warmup "$WARMUP" --duration "$DURATION" --drain 5s --json \
    >"$OUT/$1.json" 2>"$OUT/$1.log" || rc=$?
  (( rc == 0 )) || echo "ab-pairs: $1 exited $rc (see $OUT/$1.log)" >&2
}

for r in $(seq 1 "$ROUNDS"); do
  if (( r % 2 )); then run "a-$r" "$A"; run "b-$r" "$B"; else run "b-$r" "$B"; run "a-$r" "$A"; fi
done

python3 - "$OUT" "$ROUNDS" "$A" "$B" "$SCENARIO" <<'PY'
import json, statistics, sys
out, rounds, a, b, scenario = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
cpu_key, lat_key, unit, lat_name = (
    ("cpu_us_per_message", "ack_latency", "per message", "send-to-ack")
    if scenario == "pairs"
    else ("cpu_us_per_delivery", "delivery_latency", "per delivery", "delivery"))
def runs(side):
    got = []
    for r in range(1, rounds + 1):
        try:
            with open(f"{out}/{side}-{r}.json") as f:
                j = json.load(f)
        except (OSError, ValueError):
            print(f"{side}-{r}: no result")
            continue
        if j.get("passed") is not True:
            print(f"{side}-{r}: did not pass its check; left out")
            continue
        got.append((j[cpu_key], j[lat_key]["p99"] / 1000))
    return got
res = {}
for side, bin in (("a", a), ("b", b)):
    got = runs(side)
    if not got:
        continue
    cpu = statistics.median(g[0] for g in got)
    p99 = statistics.median(g[1] for g in got)
    res[side] = cpu
    rounds_txt = " / ".join(f"{g[0]:.1f}" for g in got)
    print(f"{side.upper()} {bin}: {cpu:.1f} µs CPU {unit} (rounds {rounds_txt}), "
          f"{lat_name} P99 {p99:.2f} ms")
if "a" in res and "b" in res:
    print(f"B / A: {res['b'] / res['a']:.3f}")
print(f"runs kept in {out}")
PY
