#!/usr/bin/env bash
# What `rocgate serve` does with more clients than `max_connections`: one build, or two
# (A then B, one after the other) for a before/after comparison.
#
# Each build runs alone in front of one upstream (examples/bench_server bare), with
# `max_connections = 50`, `idle_timeout = "20s"` and one route admitting everything (a
# token bucket at 2,000,000 req/s), in two phases:
#   1. sustained overload: 200 keep-alive clients, four times the cap,
#          wrk -t2 -c200 -d${DURATION}s --timeout 30s --latency
#      req/s, p50, p99, wrk's socket errors (a read error is a request that found its
#      connection closed before an answer) and, from /metrics, the connections closed
#      to make room (rocgate_client_connections_reclaimed_total) and those accepted at
#      the cap (rocgate_client_connection_limit_reached_total);
#   2. a full house of idle connections: once every phase-1 connection has closed,
#      50 keep-alive connections each make one request and stay open, idle, then 100
#      new clients arrive 10 at a time, each connecting, sending one GET and reading
#      the answer: their latencies and failures, how the 50 held connections ended
#      (closed by the proxy, reset, or still open), and the two counters' increase.
# A build that does not close idle connections at the cap leaves the new clients of
# phase 2 waiting until the held ones reach idle_timeout (20 s), and in phase 1 serves
# only the first 50 of wrk's connections while the other 150 wait: its req/s is then
# that of 50 clients, not comparable with a build that serves all 200.
#
# Usage:  scripts/bench-cap.sh BINARY [B_BINARY]   (DURATION=10: 15 s a build, 35 s for one
#                                                  that leaves new clients waiting)
#         DURATION=20 scripts/bench-cap.sh /tmp/rocgate-old target/release/rocgate
# Needs curl, wrk and python3 (installed with apt-get when missing). Loopback only;
# stops by itself (each phase is bounded in time); every process it starts is killed
# by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/proxy-configs.sh
source scripts/proxy-configs.sh
# shellcheck source=scripts/processes.sh
source scripts/processes.sh

DURATION=${DURATION:-10}
if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: scripts/bench-cap.sh BINARY [B_BINARY]" >&2
    exit 2
fi
for bin in "$@"; do
    [[ -x $bin && -f $bin ]] || { echo "bench-cap: $bin: not an executable file" >&2; exit 2; }
done
[[ $DURATION =~ ^[1-9][0-9]*$ ]] ||
    { echo "bench-cap: DURATION must be a positive whole number of seconds, got '$DURATION'" >&2; exit 2; }
missing=()
for tool in curl wrk python3; do command -v "$tool" >/dev/null || missing+=("$tool"); done
install_packages "${missing[@]}"

work_reaped_on_exit

cargo build --release --quiet --example bench_server --no-default-features --features http
"${CARGO_TARGET_DIR:-target}/release/examples/bench_server" bare 127.0.0.1:0 \
    >"$work/upstream.out" 2>&1 &
pids+=($!)

upstream=$(await_url upstream_url upstream)
proxy_url() { sed -n 's/.* listen=\([0-9.:]*\).*/http:\/\/\1/p' "$work/proxy.err"; }
admin_url() { sed -n 's/.* admin=\([0-9.:]*\).*/http:\/\/\1/p' "$work/proxy.err"; }

# The value of the metric $1 at the admin URL $2 (0 when the build has no such metric).
metric() {
    curl -s --max-time 5 "$2/metrics" | awk -v m="$1" '$1 == m {v = $2} END {print v + 0}'
}

# Phase 2, in Python: connects HOLD keep-alive connections to 127.0.0.1:PORT, each
# served one request, then NEW clients CONC at a time. Prints one line:
# "ok errors p50_ms p99_ms max_ms wall_s closed reset open first_error".
phase2() {
    timeout 120 python3 - "$1" 50 100 10 <<'PY'
import select, socket, sys, threading, time

port, HOLD, NEW, CONC = (int(a) for a in sys.argv[1:])
REQ = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"


def answer(s):
    """Reads one response with a Content-Length body; returns its status line."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(4096)
        if not d:
            raise EOFError("closed before an answer")
        buf += d
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        d = s.recv(4096)
        if not d:
            raise EOFError("closed mid-body")
        body += d
    return lines[0]


held = []
for _ in range(HOLD):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(REQ)
    answer(s)
    held.append(s)
time.sleep(0.5)

latencies, errors, lock = [], [], threading.Lock()


def client():
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(REQ)
            status = answer(s)
        if b" 200 " not in status:
            raise ValueError(status.decode(errors="replace"))
        with lock:
            latencies.append(time.monotonic() - t0)
    except Exception as e:  # every failure is counted and the first one printed
        with lock:
            errors.append(repr(e).replace(" ", "_"))


t0 = time.monotonic()
for start in range(0, NEW, CONC):
    threads = [threading.Thread(target=client) for _ in range(min(CONC, NEW - start))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
wall = time.monotonic() - t0

ended = {"closed": 0, "reset": 0, "open": 0}
for s in held:
    try:
        readable, _, _ = select.select([s], [], [], 0)
        ended["closed" if readable and s.recv(1) == b"" else "open"] += 1
    except ConnectionResetError:
        ended["reset"] += 1
    s.close()

latencies.sort()
ms = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else 0
print(len(latencies), len(errors), f"{ms(0.5):.1f} {ms(0.99):.1f} {ms(1):.1f} {wall:.2f}",
      ended["closed"], ended["reset"], ended["open"], errors[0] if errors else "-")
PY
}

# Runs both phases against build $2, labelled $1; appends its summary to $work/summary.
run() {
    local label=$1 bin=$2 url admin pid gauge reclaimed0 reached0 reclaimed1 reached1
    local rps p50 p99 errs out ok failed q50 q99 qmax wall closed reset open first
    write_rocgate_config "$work/$label.toml" 2000000 "$upstream"
    sed -i 's/^upstream = .*/&\nmax_connections = 50\nidle_timeout = "20s"/' "$work/$label.toml"
    RUST_LOG=info "$bin" serve --config "$work/$label.toml" >/dev/null 2>"$work/proxy.err" &
    pid=$!
    pids+=("$pid")
    url=$(await_url proxy_url "proxy $label")
    admin=$(await_url admin_url "the admin API of $label")

    echo "$label phase 1: wrk -t2 -c200 -d${DURATION}s --timeout 30s --latency"
    wrk -t2 -c200 -d"${DURATION}s" --timeout 30s --latency "$url/" >"$work/wrk.out"
    rps=$(awk '/Requests\/sec/ {printf "%.0f", $2}' "$work/wrk.out")
    p50=$(awk '$1 == "50%" {print $2}' "$work/wrk.out")
    p99=$(awk '$1 == "99%" {print $2}' "$work/wrk.out")
    errs=$(sed -n 's/^ *Socket errors: //p' "$work/wrk.out")
    reclaimed0=$(metric rocgate_client_connections_reclaimed_total "$admin")
    reached0=$(metric rocgate_client_connection_limit_reached_total "$admin")

    # Phase 2 starts from no connection open: wrk's have closed (idle_timeout at most).
    for _ in $(seq 300); do
        gauge=$(metric rocgate_client_connections "$admin")
        ((gauge == 0)) && break
        sleep 0.1
    done
    ((gauge == 0)) || { echo "bench-cap: $gauge connections still open 30 s after wrk" >&2; exit 1; }

    echo "$label phase 2: 50 idle keep-alive connections held, 100 new clients 10 at a time"
    out=$(phase2 "${url##*:}") || { echo "bench-cap: phase 2 failed against $label" >&2; exit 1; }
    read -r ok failed q50 q99 qmax wall closed reset open first <<<"$out"
    if [[ $first == - ]]; then first=; else first=", the first: $first"; fi
    reclaimed1=$(metric rocgate_client_connections_reclaimed_total "$admin")
    reached1=$(metric rocgate_client_connection_limit_reached_total "$admin")
    reap "$pid"
    unset 'pids[-1]'

    {
        echo "$label: $bin"
        echo "  phase 1: $rps req/s, p50 $p50, p99 $p99, socket errors: ${errs:-none};"
        echo "           $reclaimed0 connections reclaimed, $reached0 accepted at the cap"
        echo "  phase 2: $ok of 100 new clients served ($failed failed$first), p50 $q50 ms," \
            "p99 $q99 ms, max $qmax ms, all in $wall s;"
        echo "           held: $closed closed by the proxy, $reset reset, $open still open;" \
            "$((reclaimed1 - reclaimed0)) reclaimed, $((reached1 - reached0)) accepted at the cap"
    } >>"$work/summary"
}

run A "$1"
if [[ $# -eq 2 ]]; then run B "$2"; fi
echo
cat "$work/summary"
