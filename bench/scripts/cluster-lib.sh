# Shared by idle-50k.sh, storm-10k.sh and headline.sh (sourced, not run): what a run on
# a 3-node cluster of the local NATS needs besides its own steps.

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
