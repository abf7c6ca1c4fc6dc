#!/usr/bin/env bash
# Instructions per request in user space, under callgrind, for the configurations of
# scripts/bench-http.sh. Unlike req/s, these counts barely move from run to run, so
# they compare configurations on a noisy machine.
#   layer suite: examples/bench_server in each of its modes (bare axum, the no-op
#                layer, rocgate's AdmissionLayer and tower_governor, admitting and
#                rejecting);
#   proxy suite: `rocgate serve` and nginx as reverse proxies in front of bench_server
#                (bare, not under valgrind), admitting everything and rejecting almost
#                everything.
#
# For each configuration: start the server under `valgrind --tool=callgrind`, warm up
# with `wrk -t1 -c8` for 2 s, zero the counters, run wrk for DURATION seconds (default
# 4), dump, and divide the instructions of every thread by the requests wrk completed.
# nginx runs as one process (`master_process off`). Prints one line per configuration;
# the callgrind files stay in OUT (default a temporary directory, removed at the end)
# for `callgrind_annotate --inclusive=yes`.
#
# Usage:  scripts/callgrind-http.sh                (both suites)
#         SUITE=layer scripts/callgrind-http.sh
#         SUITE=proxy DURATION=8 OUT=/tmp/cg scripts/callgrind-http.sh
#         SUITE=layer MODES="bare rocgate-admit-outside" scripts/callgrind-http.sh
# Needs valgrind, wrk, curl and nginx (installed with apt-get when missing). Loopback
# only; every process it starts is killed by PID on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/proxy-configs.sh
source scripts/proxy-configs.sh
# shellcheck source=scripts/processes.sh
source scripts/processes.sh

DURATION=${DURATION:-4}
SUITE=${SUITE:-all}
all_modes="bare noop-layer rocgate-admit rocgate-reject rocgate-admit-outside rocgate-reject-outside governor-admit governor-reject"
MODES=${MODES:-$all_modes}
for mode in $MODES; do
    [[ " $all_modes " == *" $mode "* ]] ||
        { echo "callgrind-http: MODES: unknown mode '$mode' (known: $all_modes)" >&2; exit 2; }
done
case $SUITE in
all | layer | proxy) ;;
*)
    echo "callgrind-http: SUITE must be all, layer or proxy, got '$SUITE'" >&2
    exit 2
    ;;
esac
if ! [[ $DURATION =~ ^[0-9]+$ ]] || ((DURATION < 1)); then
    echo "callgrind-http: DURATION must be a whole number of seconds, got '$DURATION'" >&2
    exit 2
fi
missing=()
for tool in valgrind wrk curl; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]] || missing+=(nginx-light)
install_packages "${missing[@]}"
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

cargo build --release --quiet --example bench_server --no-default-features --features http
[[ $SUITE == layer ]] || cargo build --release --quiet --bin rocgate
target="${CARGO_TARGET_DIR:-target}/release"

work_reaped_on_exit
out=${OUT:-$work/callgrind}
mkdir -p "$out" "$work/nginx/logs" "$work/nginx/tmp"

# Runs $2 until it prints something, for up to $1 tenths of a second.
poll() {
    local tries=$1 result
    shift
    for ((; tries > 0; tries--)); do
        if result=$("$@" 2>/dev/null) && [[ -n $result ]]; then
            echo "$result"
            return
        fi
        sleep 0.1
    done
    return 1
}

"$target/examples/bench_server" bare 127.0.0.1:0 >"$work/upstream.out" 2>&1 &
pids+=($!)
upstream=$(poll 100 sed -n 's/^listening on //p' "$work/upstream.out") ||
    { echo "callgrind-http: the upstream did not start" >&2; exit 1; }

# Measures the proxy of PID $2 at URL $3 as configuration $1.
measure() {
    local name=$1 pid=$2 url=$3 file ir requests
    poll 600 curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$url/" >/dev/null ||
        { echo "callgrind-http: $name does not answer" >&2; exit 1; }
    wrk -t1 -c8 -d2s "$url/" >/dev/null
    callgrind_control -z "$pid" >/dev/null
    wrk -t1 -c8 -d"${DURATION}s" "$url/" >"$work/wrk.out"
    callgrind_control -d "$pid" >/dev/null
    file=$(poll 100 find "$out" -name "$name.$pid.*" -newer "$work/wrk.out") ||
        { echo "callgrind-http: no dump for $name" >&2; exit 1; }
    sleep 0.5 # the dump may still be being written
    ir=$(callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
    requests=$(awk '/ requests in / { print $1 }' "$work/wrk.out")
    printf '%-24s %10s requests %14s instructions %8.0f per request\n' "$name" "$requests" "$ir" \
        "$(awk -v i="$ir" -v r="$requests" 'BEGIN { print i / r }')"
    reap "$pid"
}

if [[ $SUITE != proxy ]]; then
    for mode in $MODES; do
        valgrind --tool=callgrind --callgrind-out-file="$out/$mode.%p" \
            "$target/examples/bench_server" "$mode" 127.0.0.1:0 >"$work/$mode.out" 2>&1 &
        pid=$!
        pids+=("$pid")
        url=$(poll 600 sed -n 's/^listening on //p' "$work/$mode.out") ||
            { echo "callgrind-http: bench_server $mode did not start" >&2; exit 1; }
        measure "$mode" "$pid" "$url"
    done
fi
[[ $SUITE == layer ]] && exit 0

for rate in 2000000 1; do
    if ((rate == 1)); then kind=reject; else kind=admit; fi
    write_rocgate_config "$work/rocgate.toml" "$rate" "$upstream"
    RUST_LOG=info valgrind --tool=callgrind --callgrind-out-file="$out/rocgate-$kind.%p" \
        "$target/rocgate" serve --config "$work/rocgate.toml" >/dev/null 2>"$work/rocgate-$kind.err" &
    pid=$!
    pids+=("$pid")
    listen=$(poll 600 sed -n 's/.*listen=\([0-9.:]*\).*/\1/p' "$work/rocgate-$kind.err") ||
        { echo "callgrind-http: rocgate serve did not start" >&2; cat "$work/rocgate-$kind.err" >&2; exit 1; }
    measure "rocgate-$kind" "$pid" "http://$listen"

    port=$((10000 + RANDOM % 20000))
    prefix="$work/nginx"
    write_nginx_config "$prefix" "$port" "$rate" "${upstream#http://}" "master_process off;"
    valgrind --tool=callgrind --callgrind-out-file="$out/nginx-$kind.%p" \
        "$nginx_bin" -p "$prefix" -e "$prefix/logs/error.log" -c "$prefix/nginx.conf" \
        >/dev/null 2>"$work/nginx.err" &
    pid=$!
    pids+=("$pid")
    measure "nginx-$kind" "$pid" "http://127.0.0.1:$port"
done
