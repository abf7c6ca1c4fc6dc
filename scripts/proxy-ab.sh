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
# Per run: req/s, p99, the slowest request, and the proxy's CPU time per request (from
# /proc/PID/stat). The summary gives each build's median req/s, p99, slowest request
# and CPU per request, and the median over rounds of B's req/s over A's in the same
# round, with how many rounds B won.
#
# ROUTES=N gives each proxy N routes (N − 1 exact paths no request takes, then the one
# above); SCRAPE=S has curl (on CPU 1) scrape the loaded proxy's /metrics, gzipped as
# Prometheus asks for it, every S seconds while wrk runs: what scrapes of many routes
# cost the requests beside them.
#
# Usage:  scripts/proxy-ab.sh A_BINARY B_BINARY       (ROUNDS=6 DURATION=5: about 1 min)
#         ROUNDS=10 DURATION=8 scripts/proxy-ab.sh /tmp/rocgate-old target/release/rocgate
#         ROUTES=1000 SCRAPE=0.5 scripts/proxy-ab.sh /tmp/rocgate-old target/release/rocgate
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
ROUTES=${ROUTES:-1}
SCRAPE=${SCRAPE:-}
if [[ $# -ne 2 ]]; then
    echo "usage: scripts/proxy-ab.sh A_BINARY B_BINARY" >&2
    exit 2
fi
for bin in "$1" "$2"; do
    [[ -x $bin && -f $bin ]] || { echo "proxy-ab: $bin: not an executable file" >&2; exit 2; }
done
for n in ROUNDS DURATION ROUTES; do
    [[ ${!n} =~ ^[1-9][0-9]*$ ]] || { echo "proxy-ab: $n must be a positive whole number, got '${!n}'" >&2; exit 2; }
done
[[ -z $SCRAPE || $SCRAPE =~ ^([0-9]+\.)?[0-9]+$ ]] ||
    { echo "proxy-ab: SCRAPE must be a number of seconds, got '$SCRAPE'" >&2; exit 2; }
missing=()
for tool in wrk curl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
install_packages "${missing[@]}"

work_reaped_on_exit

cargo build --release --quiet --example bench_server --no-default-features --features http
taskset -c 1 "${CARGO_TARGET_DIR:-target}/release/examples/bench_server" bare 127.0.0.1:0 \
    >"$work/upstream.out" 2>&1 &
pids+=($!)

upstream=$(await_url upstream_url upstream)

# Starts build $2 as proxy $1 on CPU 0; its PID goes to $work/$1.pid.
start() {
    write_rocgate_config "$work/$1.all.toml" 2000000 "$upstream"
    # The routes no request takes come first: the one for every path would shadow them.
    for i in $(seq 2 "$ROUTES"); do
        printf '[[routes]]\nname = "r%d"\npath = "/r/%d"\n\n' "$i" "$i"
    done | cat - "$work/$1.all.toml" >"$work/$1.toml"
    RUST_LOG=info taskset -c 0 "$2" serve --config "$work/$1.toml" >/dev/null 2>"$work/$1.err" &
    pids+=($!)
    echo $! >"$work/$1.pid"
}
start a "$1"
start b "$2"
a_url() { sed -n 's/.* listen=\([0-9.:]*\).*/http:\/\/\1/p' "$work/a.err"; }
b_url() { sed -n 's/.* listen=\([0-9.:]*\).*/http:\/\/\1/p' "$work/b.err"; }
admin_url() { sed -n 's/.* admin=\([0-9.:]*\).*/http:\/\/\1/p' "$work/$1.err"; }
url_a=$(await_url a_url "proxy A")
url_b=$(await_url b_url "proxy B")
for url in "$url_a" "$url_b"; do
    taskset -c 1 wrk -t1 -c64 -d1s "$url/" >/dev/null
done

# Scrapes $1's /metrics every $SCRAPE seconds from CPU 1 until killed, counting the
# scrapes in $work/scrapes. Killed, it exits once the scrape or sleep under way is
# over: a scrape still running would load the proxy beside the next run.
scrape() {
    local n=0
    taskset -p -c 1 "$BASHPID" >/dev/null
    trap 'exit 0' TERM
    while :; do
        curl -s --compressed -o /dev/null --max-time 10 "$1/metrics" && n=$((n + 1))
        echo "$n" >"$work/scrapes"
        sleep "$SCRAPE"
    done
}

# Loads proxy $1 once; appends "round rps cpu_us p99_ms max_ms" to $work/$1.runs and
# prints the run.
run() {
    local x=$1 round=$2 url pid hz c0 c1 n rps p99 max cpu scraper=
    url=$url_a
    [[ $x == b ]] && url=$url_b
    pid=$(cat "$work/$x.pid")
    hz=$(getconf CLK_TCK)
    if [[ -n $SCRAPE ]]; then
        echo 0 >"$work/scrapes"
        scrape "$(admin_url "$x")" &
        scraper=$!
        pids+=("$scraper")
    fi
    c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    taskset -c 1 wrk -t1 -c64 -d"${DURATION}s" --latency "$url/" >"$work/wrk.out"
    c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    if [[ -n $scraper ]]; then
        kill "$scraper"
        wait "$scraper" 2>/dev/null || true
        unset 'pids[-1]'
    fi
    n=$(awk '/ requests in / {print $1}' "$work/wrk.out")
    rps=$(awk '/Requests\/sec/ {print $2}' "$work/wrk.out")
    p99=$(awk '$1 == "99%" {print $2}' "$work/wrk.out")
    max=$(awk '$1 == "Latency" {print $4}' "$work/wrk.out")
    cpu=$(awk -v c=$((c1 - c0)) -v n="$n" -v hz="$hz" 'BEGIN {printf "%.1f", c / hz * 1e6 / n}')
    echo "$round $rps $cpu $(ms "$p99") $(ms "$max")" >>"$work/$x.runs"
    printf '%s round %d: %10.0f req/s  p99 %8s  max %8s  cpu %6s us/req  %sload %s\n' \
        "$(tr a-b A-B <<<"$x")" "$round" "$rps" "$p99" "$max" "$cpu" \
        "${scraper:+$(cat "$work/scrapes") scrapes  }" "$(cut -d' ' -f1 /proc/loadavg)"
}

# wrk's duration ($1: 812.00us, 1.20ms, 2.01s) in milliseconds.
ms() {
    awk -v d="$1" 'BEGIN {
        n = d + 0; u = d; sub(/^[0-9.]+/, "", u)
        print (u == "us") ? n / 1000 : (u == "s") ? n * 1000 : (u == "m") ? n * 60000 : n
    }'
}
for round in $(seq "$ROUNDS"); do
    if ((round % 2)); then order="a b"; else order="b a"; fi
    for x in $order; do run "$x" "$round"; done
done

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "medians over $ROUNDS rounds:"
for x in a b; do
    printf '  %s: %.0f req/s, p99 %.2f ms, slowest %.2f ms, %.1f us CPU per request\n' \
        "$(tr a-b A-B <<<"$x")" "$(awk '{print $2}' "$work/$x.runs" | median)" \
        "$(awk '{print $4}' "$work/$x.runs" | median)" "$(awk '{print $5}' "$work/$x.runs" | median)" \
        "$(awk '{print $3}' "$work/$x.runs" | median)"
done
paste "$work/a.runs" "$work/b.runs" | awk '{print $7 / $2}' >"$work/ratios"
printf '  B / A req/s in the same round: median %.3f, B faster in %d of %d rounds\n' \
    "$(median <"$work/ratios")" "$(awk '$1 > 1' "$work/ratios" | wc -l)" "$ROUNDS"
