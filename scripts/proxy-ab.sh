#!/usr/bin/env bash
# Two builds of `rocgate serve` side by side: which one admits more requests per second.
#
# On this shared machine a suite run (scripts/bench-http.sh) moves by more than most
# changes to the proxy, so a change is judged against the build before it, in pairs:
# both proxies run at once (each pinned to CPU 0, admitting everything: one route, a
# token bucket at 2,000,000 req/s, the most the config takes) in front of one upstream
# (examples/bench_server bare, on CPU 1), and each round loads A then B (B then A in
# even rounds) with
#     taskset -c 1 wrk -t1 -c64 -d${DURATION}s --latency
# Per run: req/s, p99, and the proxy's CPU time per request (from /proc/PID/stat).
# The summary gives each build's median req/s and CPU per request, and the median over
# rounds of B's req/s over A's in the same round, with how many rounds B won.
#
# Usage:  scripts/proxy-ab.sh A_BINARY B_BINARY       (ROUNDS=6 DURATION=5: about 1 min)
#         ROUNDS=10 DURATION=8 scripts/proxy-ab.sh /tmp/rocgate-old target/release/rocgate
# Needs 2 CPUs, taskset, curl and wrk (installed with apt-get when missing). Loopback
# only; stops by itself; every process it starts is killed by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/proxy-configs.sh
source scripts/proxy-configs.sh
# shellcheck source=scripts/processes.sh
source scripts/processes.sh

ROUNDS=${ROUNDS:-6}
DURATION=${DURATION:-5}
if [[ $# -ne 2 ]]; then
    echo "usage: scripts/proxy-ab.sh A_BINARY B_BINARY" >&2
    exit 2
fi
for bin in "$1" "$2"; do
    [[ -x $bin && -f $bin ]] || { echo "proxy-ab: $bin: not an executable file" >&2; exit 2; }
done
for n in ROUNDS DURATION; do
    [[ ${!n} =~ ^[1-9][0-9]*$ ]] || { echo "proxy-ab: $n must be a positive whole number, got '${!n}'" >&2; exit 2; }
done
missing=()
for tool in wrk curl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
install_packages "${missing[@]}"

work_reaped_on_exit

cargo build --release --quiet --example bench_server --no-default-features --features http
taskset -c 1 "${CARGO_TARGET_DIR:-target}/release/examples/bench_server" bare 127.0.0.1:0 \
    >"$work/upstream.out" 2>&1 &
pids+=($!)

# Waits up to 10 s for the function $1 to print a URL that answers, and prints it.
await() {
    local url
    for _ in $(seq 100); do
        url=$($1)
        if [[ -n $url ]] && curl -s -o /dev/null --max-time 1 "$url/"; then
            echo "$url"
            return 0
        fi
        sleep 0.1
    done
    echo "proxy-ab: $2 did not answer within 10 s" >&2
    return 1
}
upstream_url() { sed -n 's/^listening on //p' "$work/upstream.out"; }
upstream=$(await upstream_url upstream)

# Starts build $2 as proxy $1 on CPU 0; its PID goes to $work/$1.pid.
start() {
    write_rocgate_config "$work/$1.toml" 2000000 "$upstream"
    RUST_LOG=info taskset -c 0 "$2" serve --config "$work/$1.toml" >/dev/null 2>"$work/$1.err" &
    pids+=($!)
    echo $! >"$work/$1.pid"
}
start a "$1"
start b "$2"
a_url() { sed -n 's/.*listen=\([0-9.:]*\).*/http:\/\/\1/p' "$work/a.err"; }
b_url() { sed -n 's/.*listen=\([0-9.:]*\).*/http:\/\/\1/p' "$work/b.err"; }
url_a=$(await a_url "proxy A")
url_b=$(await b_url "proxy B")
for url in "$url_a" "$url_b"; do
    taskset -c 1 wrk -t1 -c64 -d1s "$url/" >/dev/null
done

# Loads proxy $1 once; appends "round rps cpu_us" to $work/$1.runs and prints the run.
run() {
    local x=$1 round=$2 url pid hz c0 c1 n rps p99 cpu
    url=$url_a
    [[ $x == b ]] && url=$url_b
    pid=$(cat "$work/$x.pid")
    hz=$(getconf CLK_TCK)
    c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    taskset -c 1 wrk -t1 -c64 -d"${DURATION}s" --latency "$url/" >"$work/wrk.out"
    c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    n=$(awk '/ requests in / {print $1}' "$work/wrk.out")
    rps=$(awk '/Requests\/sec/ {print $2}' "$work/wrk.out")
    p99=$(awk '$1 == "99%" {print $2}' "$work/wrk.out")
    cpu=$(awk -v c=$((c1 - c0)) -v n="$n" -v hz="$hz" 'BEGIN {printf "%.1f", c / hz * 1e6 / n}')
    echo "$round $rps $cpu" >>"$work/$x.runs"
    printf '%s round %d: %10.0f req/s  p99 %8s  cpu %6s us/req  load %s\n' \
        "$(tr a-b A-B <<<"$x")" "$round" "$rps" "$p99" "$cpu" "$(cut -d' ' -f1 /proc/loadavg)"
}
for round in $(seq "$ROUNDS"); do
    if ((round % 2)); then order="a b"; else order="b a"; fi
    for x in $order; do run "$x" "$round"; done
done

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "medians over $ROUNDS rounds:"
for x in a b; do
    printf '  %s: %.0f req/s, %.1f us CPU per request\n' "$(tr a-b A-B <<<"$x")" \
        "$(awk '{print $2}' "$work/$x.runs" | median)" "$(awk '{print $3}' "$work/$x.runs" | median)"
done
paste "$work/a.runs" "$work/b.runs" | awk '{print $5 / $2}' >"$work/ratios"
printf '  B / A req/s in the same round: median %.3f, B faster in %d of %d rounds\n' \
    "$(median <"$work/ratios")" "$(awk '$1 > 1' "$work/ratios" | wc -l)" "$ROUNDS"
