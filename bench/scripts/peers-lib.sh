# Shared by peers.sh and curves.sh (sourced, not run): a work dir ($OUT), a fresh
# Mosquitto (bench/configs/peers/mosquitto.conf: MQTT 127.0.0.1:28883, WebSocket :28080)
# and nats-server (bench/configs/peers/nats.conf: 127.0.0.1:28222, WebSocket :28081),
# both killed on exit, and `run NAME SERVER SCENARIO FLAGS...`: one `im-bench peer` run,
# its JSON in $OUT/NAME.json. Expects ROOT, T (the release dir), MQTT_WS and NATS_WS.

for b in im-server im-bench; do
  [[ -x "$T/$b" ]] || { echo "$(basename "$0" .sh): $T/$b missing: cargo build --release -p im-server -p im-bench" >&2; exit 2; }
done
for b in mosquitto nats-server python3; do
  command -v "$b" >/dev/null || { echo "$(basename "$0" .sh): $b not found on PATH" >&2; exit 2; }
done
for p in 28883 28080 28222 28081; do
  if ss -Hltn "sport = :$p" | grep -q .; then
    echo "$(basename "$0" .sh): port $p is taken (a peers.sh still running?)" >&2
    exit 2
  fi
done

WORK=$(mktemp -d)
OUT="${OUT:-$WORK}"
mkdir -p "$OUT"
MOSQ_PID=""
NATS_PID=""
stop_peers() {
  for p in $MOSQ_PID $NATS_PID; do
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  MOSQ_PID=""
  NATS_PID=""
}
cleanup() {
  stop_peers
  [[ "$OUT" == "$WORK" ]] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_port() {
  for _ in $(seq 1 100); do
    ss -Hltn "sport = :$1" | grep -q . && return 0
    sleep 0.1
  done
  echo "$(basename "$0" .sh): nothing listens on port $1" >&2
  exit 2
}

start_peers() {
  stop_peers
  mosquitto -c "$ROOT/bench/configs/peers/mosquitto.conf" >>"$OUT/mosquitto.log" 2>&1 &
  MOSQ_PID=$!
  nats-server -c "$ROOT/bench/configs/peers/nats.conf" >>"$OUT/nats.log" 2>&1 &
  NATS_PID=$!
  wait_port 28080
  wait_port 28081
}

# run NAME SERVER SCENARIO FLAGS...: one im-bench peer run, its JSON in $OUT/NAME.json.
run() {
  local name=$1 server=$2 scenario=$3
  shift 3
  local target
  case $server in
    im) target=(--protocol im --spawn "$T/im-server") ;;
    mosquitto) target=(--protocol mqtt-ws --url "$MQTT_WS" --server-pid "$MOSQ_PID") ;;
    nats) target=(--protocol nats-ws --url "$NATS_WS" --server-pid "$NATS_PID") ;;
  esac
  echo "$(basename "$0" .sh): $name" >&2
  local rc=0
  "$T/im-bench" peer "$scenario" "${target[@]}" --json "$@" \
    >"$OUT/$name.json" 2>"$OUT/$name.log" || rc=$?
  if (( rc != 0 )); then
    echo "$(basename "$0" .sh): $name exited $rc (see $OUT/$name.log)" >&2
    [[ -s "$OUT/$name.json" ]] || echo '{}' >"$OUT/$name.json"
  fi
}

