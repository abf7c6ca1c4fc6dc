#!/usr/bin/env bash
# HTTP front benchmark: what the admission layer costs an axum server, side by side
# with bare axum and with tower_governor.
#
# Builds examples/bench_server.rs in release and measures six configurations of the
# same hello world (GET / -> "Hello, World!"):
#   bare              axum alone
#   noop-layer        + a layer that adds nothing: what axum's Router::layer itself costs
#   rocgate-admit     + rocgate's AdmissionLayer, quota so high nothing is rejected
#   rocgate-reject    + AdmissionLayer at 1 req/s: almost everything gets a 429
#   governor-admit    + tower_governor, the same quota as rocgate-admit
#   governor-reject   + tower_governor, the same quota as rocgate-reject
# Every round runs every configuration once (the starting configuration rotates from
# round to round), so configurations are interleaved in time rather than measured in
# blocks. Each run: the server on CPU 0 (`taskset -c 0`, a current-thread runtime, so
# one core), on 127.0.0.1 and a free port; once it answers, `wrk` on CPU 1 for a short
# unrecorded warm-up, then
#     taskset -c 1 wrk -t1 -c64 -d${DURATION}s --latency http://127.0.0.1:PORT/
# then the server is killed (by its PID only).
#
# The machine may be shared, so each run also reports how busy it was just before
# (column "busy", sampled for half a second) and how much CPU time neither the server
# nor wrk used during the measurement (column "others", percent of one CPU: other
# processes or the hypervisor's steal time). A run whose "others" exceeds OTHERS_MAX
# (default 5) is flagged; with RETRIES=N it is measured again up to N times, and with
# QUIET_WAIT=N the script first waits up to about N seconds for the machine to calm down.
#
# Prints each run, then per configuration the median req/s, the median p99 latency and
# the ratio of the median req/s to bare axum's, with the issue's targets (rocgate
# admitting >= 0.97x bare, rocgate rejecting >= 0.95x bare).
#
# Usage:  scripts/bench-http.sh            (ROUNDS=3 DURATION=10 WARMUP=1: about 4 min)
#         ROUNDS=5 DURATION=20 QUIET_WAIT=60 RETRIES=2 scripts/bench-http.sh
# Needs 2 CPUs, taskset, curl and wrk (installed with apt-get when missing). Loopback
# only; stops by itself; the server is killed on exit, error or Ctrl-C. Ratios matter,
# not absolute figures: nothing else heavy (such as `cargo bench`) should run meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-1}
QUIET_WAIT=${QUIET_WAIT:-0}
RETRIES=${RETRIES:-0}
OTHERS_MAX=${OTHERS_MAX:-5}
CONFIGS=(bare noop-layer rocgate-admit rocgate-reject governor-admit governor-reject)

for var in ROUNDS DURATION WARMUP QUIET_WAIT RETRIES OTHERS_MAX; do
    if ! [[ ${!var} =~ ^[0-9]+$ ]]; then
        echo "bench-http: $var must be a whole number, got '${!var}'" >&2
        exit 2
    fi
done
if ((ROUNDS < 1 || DURATION < 1)); then
    echo "bench-http: ROUNDS and DURATION must be at least 1" >&2
    exit 2
fi
if (($(nproc) < 2)); then
    echo "bench-http: needs 2 CPUs (server on CPU 0, wrk on CPU 1), found $(nproc)" >&2
    exit 1
fi

# Installs Debian packages that are missing; updates the package lists only if needed.
ensure() {
    local missing=()
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    ((${#missing[@]} == 0)) && return
    echo "installing ${missing[*]}"
    apt-get install -y -q "${missing[@]}" >/dev/null ||
        { apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; }
}
ensure wrk curl
command -v taskset >/dev/null || { echo "bench-http: taskset (util-linux) is missing" >&2; exit 1; }

if others=$(pgrep -f "cargo bench|target/release/deps/check-" | tr '\n' ' ') && [[ -n $others ]]; then
    echo "warning: other benchmarks are running (PIDs $others); the numbers will be disturbed" >&2
fi

cargo build --release --quiet --example bench_server --no-default-features --features http
server="${CARGO_TARGET_DIR:-target}/release/examples/bench_server"

work=$(mktemp -d)
server_pid=""
stop_server() {
    if [[ -n $server_pid ]]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=""
    fi
}
cleanup() {
    stop_server
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts the server in mode $1 on CPU 0 and sets `url` once it answers.
start_server() {
    local mode=$1 tries
    : >"$work/server.out"
    # taskset execs the server: $! is the server's own PID.
    taskset -c 0 "$server" "$mode" 127.0.0.1:0 >"$work/server.out" 2>"$work/server.err" &
    server_pid=$!
    url=""
    for ((tries = 0; tries < 100; tries++)); do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            echo "bench-http: the $mode server exited:" >&2
            cat "$work/server.err" >&2
            server_pid=""
            exit 1
        fi
        url=$(sed -n 's/^listening on //p' "$work/server.out")
        if [[ -n $url ]] && curl -s -o /dev/null --max-time 1 "$url/"; then
            return
        fi
        sleep 0.1
    done
    echo "bench-http: the $mode server did not answer within 10 s" >&2
    exit 1
}

# Converts a wrk latency ("812.00us", "1.23ms", "1.01s") to microseconds.
to_us() {
    awk -v v="$1" 'BEGIN {
        n = v + 0
        if (v ~ /us$/) f = 1; else if (v ~ /ms$/) f = 1e3; else if (v ~ /s$/) f = 1e6; else f = 1
        printf "%.0f", n * f
    }'
}

# How busy the machine is (percent of both CPUs) over half a second, while nothing of
# ours runs: anything well above zero means another load will disturb the next run.
busy_percent() {
    local i1 t1 i2 t2
    read -r i1 t1 < <(cpu_times)
    sleep 0.5
    read -r i2 t2 < <(cpu_times)
    awk -v i="$((i2 - i1))" -v t="$((t2 - t1))" 'BEGIN { printf "%.0f", (t > 0 ? 100 * (1 - i / t) : 0) }'
}
cpu_times() {
    awk '/^cpu / { t = 0; for (k = 2; k <= 9; k++) t += $k; print $5 + $6, t }' /proc/stat
}

# Median of the numbers given as arguments.
median() {
    printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END {
        if (NR % 2) print a[(NR + 1) / 2]; else printf "%.2f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2
    }'
}

# CPU ticks (USER_HZ) a process has used, user and system.
proc_ticks() {
    awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# One measurement of configuration $1. Sets r (req/s), l (wrk's p99), total, bad
# (non-2xx count), errors, busy (percent busy before the run) and others: the CPU
# time that neither the server nor wrk used during the measurement (other processes,
# or the hypervisor's steal time), as a percent of one CPU.
measure() {
    local mode=$1 waited i1 t1 i2 t2 s1 s2 w
    busy=$(busy_percent)
    for ((waited = 0; busy > 10 && waited < QUIET_WAIT; waited++)); do
        sleep 0.5
        busy=$(busy_percent)
    done
    start_server "$mode"
    if ((WARMUP > 0)); then
        timeout $((WARMUP + 30)) taskset -c 1 wrk -t1 -c64 -d"${WARMUP}s" "$url/" >/dev/null
    fi
    read -r i1 t1 < <(cpu_times)
    s1=$(proc_ticks "$server_pid")
    local TIMEFORMAT='%U %S'
    { time timeout $((DURATION + 30)) taskset -c 1 \
        wrk -t1 -c64 -d"${DURATION}s" --latency "$url/" >"$work/wrk.out" 2>&1; } 2>"$work/wrk.time"
    s2=$(proc_ticks "$server_pid")
    read -r i2 t2 < <(cpu_times)
    stop_server
    w=$(awk '{ printf "%.0f", 100 * ($1 + $2) }' "$work/wrk.time")
    others=$(awk -v busy="$(((t2 - t1) - (i2 - i1)))" -v ours="$((s2 - s1 + w))" \
        -v cpus="$(nproc)" -v total="$((t2 - t1))" \
        'BEGIN { o = busy - ours; if (o < 0) o = 0; printf "%.0f", (total > 0 ? 100 * o * cpus / total : 0) }')
    local out="$work/wrk.out"
    r=$(awk '/^Requests\/sec:/ { print $2 }' "$out")
    l=$(awk '$1 == "99%" { print $2 }' "$out")
    total=$(awk '/ requests in / { print $1 }' "$out")
    bad=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' "$out")
    errors=$(sed -n 's/^ *Socket errors: //p' "$out")
    if [[ -z $r || -z $l || -z $total ]]; then
        echo "bench-http: cannot read wrk's output for $mode:" >&2
        cat "$out" >&2
        exit 1
    fi
}

declare -A rps p99 non2xx
n=${#CONFIGS[@]}
echo "$ROUNDS rounds x $n configurations x ${DURATION}s (+${WARMUP}s warm-up each)"
echo
printf '%-6s %-16s %10s %9s %8s %7s %7s  %s\n' round configuration req/s "p99 us" non-2xx \
    busy others "socket errors"
noisy=0
for ((round = 1; round <= ROUNDS; round++)); do
    for ((i = 0; i < n; i++)); do
        mode=${CONFIGS[(i + round - 1) % n]}
        for ((attempt = 0; ; attempt++)); do
            measure "$mode"
            ((others > OTHERS_MAX && attempt < RETRIES)) || break
            printf '%-6s %-16s %10.0f  (discarded: others used %s%% of a CPU; retrying)\n' \
                "$round" "$mode" "$r" "$others"
        done
        ((others <= OTHERS_MAX)) || noisy=$((noisy + 1))
        rps[$mode,$round]=$r
        p99[$mode,$round]=$(to_us "$l")
        non2xx[$mode,$round]=$(awk -v b="${bad:-0}" -v t="$total" 'BEGIN { printf "%.1f%%", 100 * b / t }')
        printf '%-6s %-16s %10.0f %9s %8s %6s%% %6s%%  %s\n' "$round" "$mode" "$r" \
            "${p99[$mode,$round]}" "${non2xx[$mode,$round]}" "$busy" "$others" "${errors:-none}"
    done
done

declare -A med_rps med_p99
for mode in "${CONFIGS[@]}"; do
    rs=() ls=()
    for ((round = 1; round <= ROUNDS; round++)); do
        rs+=("${rps[$mode,$round]}")
        ls+=("${p99[$mode,$round]}")
    done
    med_rps[$mode]=$(median "${rs[@]}")
    med_p99[$mode]=$(median "${ls[@]}")
done

ratio() { awk -v a="${med_rps[$1]}" -v b="${med_rps[bare]}" 'BEGIN { printf "%.3f", a / b }'; }

echo
echo "medians over $ROUNDS rounds (server on 1 core, wrk -t1 -c64 -d${DURATION}s on the other):"
printf '%-16s %12s %12s %10s\n' configuration req/s "p99 us" "x bare"
for mode in "${CONFIGS[@]}"; do
    printf '%-16s %12.0f %12.0f %10s\n' "$mode" "${med_rps[$mode]}" "${med_p99[$mode]}" "$(ratio "$mode")"
done

echo
verdict() { awk -v r="$1" -v t="$2" 'BEGIN { print (r >= t ? "met" : "MISSED") }'; }
a=$(ratio rocgate-admit)
j=$(ratio rocgate-reject)
echo "rocgate admitting ÷ bare: $a (target >= 0.97: $(verdict "$a" 0.97))"
echo "rocgate rejecting ÷ bare: $j (target >= 0.95: $(verdict "$j" 0.95))"
if ((noisy > 0)); then
    echo "warning: in $noisy runs other processes used more than ${OTHERS_MAX}% of a CPU: do not trust these ratios" >&2
fi
