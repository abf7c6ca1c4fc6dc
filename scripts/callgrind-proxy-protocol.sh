#!/usr/bin/env bash
# Instructions per connection of `rocgate serve` under callgrind, each connection one
# request (`Connection: close`), plain and behind a PROXY protocol header: what reading
# the header costs a connection (`[server] proxy_protocol`, README's "Behind an L4 load
# balancer").
#   plain: no proxy_protocol (off), plain HTTP/1.1;
#   v1:    proxy_protocol = "any", a text header naming one of 256 clients first;
#   v2:    proxy_protocol = "any", a binary header (TCP over IPv4) so.
# For each: start rocgate serve under `valgrind --tool=callgrind` in front of
# examples/bench_server (bare, not under valgrind), warm up with 200 connections, zero
# the counters, open CONNECTIONS (default 2000) connections one after another from a
# Python client, dump, and divide the instructions of every thread by the connections
# answered 200. Prints one line per kind.
#
# Usage:  scripts/callgrind-proxy-protocol.sh
#         CONNECTIONS=5000 KINDS="plain v2" scripts/callgrind-proxy-protocol.sh
#         ROCGATE=/tmp/old/rocgate KINDS=plain scripts/callgrind-proxy-protocol.sh
# ROCGATE names the binary measured (default: this tree's release build); `plain`
# writes no proxy_protocol, so a build from before it can be measured so.
# Needs valgrind, curl and python3. Loopback only; every process it starts is killed
# by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/proxy-configs.sh
source scripts/proxy-configs.sh
# shellcheck source=scripts/processes.sh
source scripts/processes.sh

CONNECTIONS=${CONNECTIONS:-2000}
KINDS=${KINDS:-plain v1 v2}
if ! [[ $CONNECTIONS =~ ^[0-9]+$ ]] || ((CONNECTIONS < 1)); then
    echo "callgrind-proxy-protocol: CONNECTIONS must be a whole number, got '$CONNECTIONS'" >&2
    exit 2
fi
for kind in $KINDS; do
    [[ " plain v1 v2 " == *" $kind "* ]] ||
        { echo "callgrind-proxy-protocol: KINDS: unknown kind '$kind' (known: plain v1 v2)" >&2; exit 2; }
done
missing=()
for tool in valgrind curl python3; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
install_packages "${missing[@]}"

cargo build --release --quiet --example bench_server --no-default-features --features http
target="${CARGO_TARGET_DIR:-target}/release"
if [[ -z ${ROCGATE:-} ]]; then
    cargo build --release --quiet --bin rocgate
    ROCGATE="$target/rocgate"
fi

work_reaped_on_exit

# The client: $1 connections to 127.0.0.1:$2, each sending the header of kind $3 (none
# for plain) and one request; prints how many were answered 200.
cat >"$work/client.py" <<'PY'
import socket, struct, sys

count, port, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
request = b"GET / HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n"


def header(i):
    client = "203.0.113.%d" % (i % 256)
    if kind == "v1":
        return ("PROXY TCP4 %s 127.0.0.1 5123 80\r\n" % client).encode()
    if kind == "v2":
        addresses = socket.inet_aton(client) + socket.inet_aton("127.0.0.1")
        addresses += struct.pack(">HH", 5123, 80)
        fixed = b"\r\n\r\n\x00\r\nQUIT\n\x21\x11" + struct.pack(">H", len(addresses))
        return fixed + addresses
    return b""


ok = 0
for i in range(count):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(header(i) + request)
    answer = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        answer += chunk
    s.close()
    ok += answer.startswith(b"HTTP/1.1 200")
print(ok)
PY

"$target/examples/bench_server" bare 127.0.0.1:0 >"$work/upstream.out" 2>&1 &
pids+=($!)
upstream=$(await_url upstream_url "the upstream")

for kind in $KINDS; do
    protocol='proxy_protocol = "any"'
    [[ $kind == plain ]] && protocol=""
    write_rocgate_config "$work/rocgate.toml" 2000000 "$upstream" \
        "trusted_proxies = [\"127.0.0.1\"]
$protocol"
    RUST_LOG=info valgrind --tool=callgrind --callgrind-out-file="$work/rocgate-$kind.%p" \
        "$ROCGATE" serve --config "$work/rocgate.toml" >/dev/null 2>"$work/rocgate-$kind.err" &
    pid=$!
    pids+=("$pid")
    listen=""
    for _ in $(seq 600); do
        listen=$(sed -n 's/.*listen=\([0-9.:]*\).*/\1/p' "$work/rocgate-$kind.err")
        [[ -n $listen ]] && break
        sleep 0.1
    done
    [[ -n $listen ]] ||
        { echo "callgrind-proxy-protocol: rocgate serve did not start" >&2; cat "$work/rocgate-$kind.err" >&2; exit 1; }
    port=${listen##*:}
    python3 "$work/client.py" 200 "$port" "$kind" >/dev/null
    callgrind_control -z "$pid" >/dev/null
    answered=$(python3 "$work/client.py" "$CONNECTIONS" "$port" "$kind")
    touch "$work/measured"
    callgrind_control -d "$pid" >/dev/null
    file=""
    for _ in $(seq 100); do
        file=$(find "$work" -name "rocgate-$kind.$pid.*" -newer "$work/measured" | head -n 1)
        [[ -n $file ]] && break
        sleep 0.1
    done
    [[ -n $file ]] || { echo "callgrind-proxy-protocol: no dump for $kind" >&2; exit 1; }
    sleep 0.5 # the dump may still be being written
    ir=$(callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
    printf '%-6s %6s of %6s connections answered 200 %14s instructions %8.0f per connection\n' \
        "$kind" "$answered" "$CONNECTIONS" "$ir" \
        "$(awk -v i="$ir" -v r="$answered" 'BEGIN { print i / r }')"
    reap "$pid"
done
