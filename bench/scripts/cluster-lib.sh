# Shared by idle-50k.sh, storm-10k.sh and headline.sh (sourced, not run): the checks
# before a run on a 3-node cluster, starting its nodes, their URLs, and the teardown
# (its processes, its Postgres schema and its NATS KV buckets).

# Deletes a run's KV buckets (streams KV_<prefix>-nodes and KV_<prefix>-presence) over the
# plain NATS protocol, as there is no nats CLI here: delete_buckets NATS_URL PREFIX.
# Never fails the caller; a refusal is printed.
delete_buckets() {
  python3 - "$1" "$2" "$(basename "$0" .sh)" <<'PY' || true
import socket, sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
s = socket.create_connection((u.hostname or "127.0.0.1", u.port or 4222), timeout=5)
f = s.makefile("rb")
f.readline()  # INFO
s.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB _INBOX.cleanup 1\r\n')
for bucket in (f"{sys.argv[2]}-nodes", f"{sys.argv[2]}-presence"):
    s.sendall(f"PUB $JS.API.STREAM.DELETE.KV_{bucket} _INBOX.cleanup 0\r\n\r\n".encode())
    while True:  # until the API's reply (a socket timeout ends the script)
        line = f.readline()
        if not line:
            break
        if line.startswith(b"MSG"):
            body = f.read(int(line.split()[-1]) + 2).strip().decode()
            if '"success":true' not in body.replace(" ", ""):
                print(f"{sys.argv[3]}: deleting bucket {bucket}: {body}", file=sys.stderr)
            break
        if line.startswith(b"PING"):
            s.sendall(b"PONG\r\n")
PY
}

# Ends a run: stops the processes PIDS (all are signalled before any is waited for),
# drops its Postgres schema and deletes its KV buckets; never fails the caller:
# cluster_teardown PG_URL ID NATS_URL PIDS...
cluster_teardown() {
  local pg=$1 id=$2 nats=$3 p
  shift 3
  for p in "$@"; do kill "$p" 2>/dev/null || true; done
  for p in "$@"; do wait "$p" 2>/dev/null || true; done
  PGOPTIONS=--client-min-messages=warning psql "$pg" -qc "DROP SCHEMA IF EXISTS $id CASCADE" || true
  delete_buckets "$nats" "$id"
}

# Stops the run (exit 2) unless both release binaries are in the directory T and every
# node's ports (BASE_PORT + 10i for clients, + 1 for admin, i < NODES) are free:
# cluster_preflight T NODES BASE_PORT.
cluster_preflight() {
  local name b i p
  name=$(basename "$0" .sh)
  for b in im-server im-bench; do
    [[ -x "$1/$b" ]] || { echo "$name: $1/$b missing: cargo build --release -p im-server -p im-bench" >&2; exit 2; }
  done
  for i in $(seq 0 $(($2 - 1))); do
    for p in $(($3 + 10 * i)) $(($3 + 10 * i + 1)); do
      if ss -Hltn "sport = :$p" | grep -q .; then
        echo "$name: port $p is taken (set BASE_PORT)" >&2
        exit 2
      fi
    done
  done
}

# Node i's admin API and client WebSocket URL (BASE_PORT + 10i + 1, BASE_PORT + 10i).
admin() { echo "http://127.0.0.1:$((BASE_PORT + 10 * $1 + 1))"; }
ws() { echo "ws://127.0.0.1:$((BASE_PORT + 10 * $1))/ws"; }

# Starts NODES release nodes ($T/im-server) in cluster mode on schema $ID of $PG and
# prefix $ID of $NATS, each with its data dir and log under $WORK, their pids appended to
# node_pids, then waits until every one is ready (a node that is not stops the run with
# its log): start_nodes [KEY=VALUE...] (more environment for every node).
start_nodes() {
  local i
  for i in $(seq 0 $((NODES - 1))); do
    env IM_DATABASE_URL="$PG?options[search_path]=$ID" IM_NATS_URL="$NATS" IM_NODE_ID="n$i" \
      IM_CLUSTER_PREFIX="$ID" IM_JWT_SECRET="$SECRET" IM_ADMIN_TOKEN="$TOKEN" IM_LOG=warn \
      IM_LISTEN="127.0.0.1:$((BASE_PORT + 10 * i))" IM_ADMIN_LISTEN="127.0.0.1:$((BASE_PORT + 10 * i + 1))" \
      IM_DATA_DIR="$WORK/n$i" "$@" "$T/im-server" 2>"$WORK/n$i.log" &
    node_pids+=($!)
  done
  for i in $(seq 0 $((NODES - 1))); do
    for _ in $(seq 100); do curl -sf "$(admin "$i")/readyz" >/dev/null && break; sleep 0.1; done
    curl -sf "$(admin "$i")/readyz" >/dev/null || {
      echo "$(basename "$0" .sh): node n$i not ready" >&2
      cat "$WORK/n$i.log" >&2
      exit 1
    }
  done
}
