#!/usr/bin/env bash
# HTTP front benchmark: what the admission layer costs an axum server, side by side
# with bare axum and with tower_governor.
#
# Builds examples/bench_server.rs in release and measures eight configurations of the
# same hello world (GET / -> "Hello, World!"):
#   bare              axum alone
#   noop-layer        + a layer that adds nothing: what axum's Router::layer itself costs
#   rocgate-admit     + rocgate's AdmissionLayer, quota so high nothing is rejected
#   rocgate-reject    + AdmissionLayer at 1 req/s: almost everything gets a 429
#   rocgate-admit-outside, rocgate-reject-outside
#                     the same two with the layer around the whole Router instead of
#                     added by Router::layer: no per-route boxing, decided before routing
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
# admitting >= 0.97x bare, rocgate rejecting >= 0.95x bare). Each run also reports the
# CPU time the configuration's processes used per request ("cpu us", from
# /proc/PID/stat), and the summary the same ratio in CPU ("cpu x bare": bare's CPU
# per request over this one's), which does not depend on wrk keeping up.
#
# This machine's speed drifts by 30% over minutes, more than the effects measured, and
# a round of the layer suite takes 90 s. With PAIRED=1, every layer configuration is
# run beside a bare run of its own (the bare run first in odd rounds, second in even
# ones), and its ratio is the median over rounds of its req/s over that bare run's:
# drift between rounds then cancels out, and so does any cost of running second.
#
# With SUITE=proxy (or SUITE=all, the default: both suites), the reverse proxies are
# measured too, in front of the same upstream (bench_server bare, on CPU 1 with wrk):
#   rocgate-serve-admit   `rocgate serve`, one route, token bucket at 2,000,000 req/s
#                         with a bucket of one second: nothing is rejected
#   rocgate-serve-reject  the same at 1 req/s: almost everything gets a 429
#   nginx-admit           Debian's nginx (installed when missing) as a reverse proxy
#                         with `limit_req` at the same rate and burst (`nodelay`,
#                         `limit_req_status 429`), one worker, keep-alive upstream
#                         connections, no access log
#   nginx-reject          the same at 1 r/s, burst 1
# Each proxy runs on CPU 0 (rocgate's runtime then has one worker thread; nginx one
# worker process); its config is generated into a temporary directory, it is started
# on a free port as a child (nginx with `-p DIR` and `daemon off`) and killed by PID.
# The summary gives rocgate ÷ nginx for req/s and p99 with the targets (req/s >= 1,
# p99 <= 1).
#
# Usage:  scripts/bench-http.sh            (ROUNDS=3 DURATION=10 WARMUP=1: about 8 min)
#         SUITE=proxy scripts/bench-http.sh   (the proxies only: about 3 min)
#         ROUNDS=5 DURATION=20 QUIET_WAIT=60 RETRIES=2 scripts/bench-http.sh
#         SUITE=layer PAIRED=1 ROUNDS=8 DURATION=4 scripts/bench-http.sh
#         SUITE=layer PAIRED=1 ROUNDS=12 DURATION=4 \
#             ONLY="noop-layer rocgate-admit-outside rocgate-reject-outside" scripts/bench-http.sh
# Needs 2 CPUs, taskset, curl and wrk (installed with apt-get when missing; nginx too
# for the proxy suite). Loopback only; stops by itself; every server is killed on exit,
# error or Ctrl-C. Ratios matter, not absolute figures: nothing else heavy (such as
# `cargo bench`) should run meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/proxy-configs.sh
source scripts/proxy-configs.sh
# shellcheck source=scripts/processes.sh
source scripts/processes.sh

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-1}
QUIET_WAIT=${QUIET_WAIT:-0}
RETRIES=${RETRIES:-0}
OTHERS_MAX=${OTHERS_MAX:-5}
SUITE=${SUITE:-all}
PAIRED=${PAIRED:-0}
LAYER_CONFIGS=(bare noop-layer rocgate-admit rocgate-reject rocgate-admit-outside
    rocgate-reject-outside governor-admit governor-reject)
PROXY_CONFIGS=(rocgate-serve-admit rocgate-serve-reject nginx-admit nginx-reject)
case $SUITE in
    layer) CONFIGS=("${LAYER_CONFIGS[@]}") ;;
    proxy) CONFIGS=("${PROXY_CONFIGS[@]}") ;;
    all) CONFIGS=("${LAYER_CONFIGS[@]}" "${PROXY_CONFIGS[@]}") ;;
    *)
        echo "bench-http: SUITE must be layer, proxy or all, got '$SUITE'" >&2
        exit 2
        ;;
esac
# ONLY="a b": just these configurations of the suite (bare too, when a layer
# configuration is named: the layer ratios need it).
ONLY=${ONLY:-}
if [[ -n ${ONLY//[[:space:]]/} ]]; then
    chosen=()
    for c in $ONLY; do
        known=0
        for k in "${CONFIGS[@]}"; do [[ $k == "$c" ]] && known=1; done
        ((known)) || { echo "bench-http: ONLY: '$c' is not a configuration of SUITE=$SUITE (${CONFIGS[*]})" >&2; exit 2; }
    done
    for k in "${CONFIGS[@]}"; do
        for c in $ONLY; do
            if [[ $k == "$c" ]] || { [[ $k == bare ]] && [[ " ${LAYER_CONFIGS[*]} " == *" $c "* ]]; }; then
                chosen+=("$k")
                break
            fi
        done
    done
    CONFIGS=("${chosen[@]}")
fi
is_layer_config() {
    local c
    for c in "${LAYER_CONFIGS[@]}"; do [[ $c == "$1" ]] && return 0; done
    return 1
}
has_config() {
    local c
    for c in "${CONFIGS[@]}"; do [[ $c == "$1" ]] && return 0; done
    return 1
}

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
if ((PAIRED && ROUNDS % 2)); then
    echo "bench-http: PAIRED=1 needs an even ROUNDS (the bare run of a pair goes first in half the rounds), got $ROUNDS" >&2
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
    install_packages "${missing[@]}"
}
ensure wrk curl
if has_config nginx-admit && ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]]; then
    echo "installing nginx"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q nginx-light >/dev/null 2>&1 || apt-get install -y -q nginx >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q nginx >/dev/null; }
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
command -v taskset >/dev/null || { echo "bench-http: taskset (util-linux) is missing" >&2; exit 1; }

if others=$(pgrep -f "cargo bench|target/release/deps/check-" | tr '\n' ' ') && [[ -n $others ]]; then
    echo "warning: other benchmarks are running (PIDs $others); the numbers will be disturbed" >&2
fi

cargo build --release --quiet --example bench_server --no-default-features --features http
server="${CARGO_TARGET_DIR:-target}/release/examples/bench_server"
if has_config rocgate-serve-admit; then
    cargo build --release --quiet --bin rocgate
fi
rocgate="${CARGO_TARGET_DIR:-target}/release/rocgate"

# `pids`: every process of the configuration being measured, the server, or the
# upstream and the proxy in front of it.
work_reaped_on_exit
stop_server() {
    reap "${pids[@]}"
    pids=()
}

# Waits until process $2 ($1 names it) answers at `url` (set by running $3 with no
# arguments until it prints a URL). Returns 1 if the process exits.
await_url() {
    local name=$1 pid=$2 find_url=$3 tries
    url=""
    for ((tries = 0; tries < 100; tries++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            wait "$pid" 2>/dev/null || true
            return 1
        fi
        url=$("$find_url")
        if [[ -n $url ]] && curl -s -o /dev/null --max-time 1 "$url/"; then
            return
        fi
        sleep 0.1
    done
    echo "bench-http: the $name did not answer within 10 s" >&2
    exit 1
}
bench_server_url() { sed -n 's/^listening on //p' "$work/server.out"; }
exited() {
    echo "bench-http: the $1 exited:" >&2
    cat "$2" >&2
    exit 1
}

# Starts bench_server in mode $1 on CPU $2 and sets `url` once it answers.
start_bench_server() {
    local mode=$1 cpu=$2
    : >"$work/server.out"
    # taskset execs the server: $! is the server's own PID.
    taskset -c "$cpu" "$server" "$mode" 127.0.0.1:0 >"$work/server.out" 2>"$work/server.err" &
    pids+=($!)
    await_url "$mode server" "$!" bench_server_url ||
        exited "$mode server" "$work/server.err"
}

# A port nothing listens on now, below the range the kernel picks client ports from
# (nginx cannot be given port 0).
free_port() {
    local port tries low
    low=$(awk '{ print $1 }' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    ((low > 11000)) || low=32768
    for ((tries = 0; tries < 100; tries++)); do
        port=$((10000 + RANDOM % (low - 10000)))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
    echo "bench-http: no free port found" >&2
    exit 1
}

rocgate_url() { sed -n 's/.*listen=\([0-9.:]*\).*/http:\/\/\1/p' "$work/proxy.err" | head -n 1; }
nginx_url() { echo "http://127.0.0.1:$nginx_port"; }

# Starts `rocgate serve` with one route limited to $1 req/s (a bucket of one second)
# on CPU 0, in front of the upstream at $2.
start_rocgate_serve() {
    local rate=$1 upstream=$2
    write_rocgate_config "$work/rocgate.toml" "$rate" "$upstream"
    : >"$work/proxy.err"
    RUST_LOG=info taskset -c 0 "$rocgate" serve --config "$work/rocgate.toml" \
        >/dev/null 2>"$work/proxy.err" &
    pids+=($!)
    await_url "rocgate serve" "$!" rocgate_url ||
        exited "rocgate serve" "$work/proxy.err"
}

# Starts nginx with one worker on CPU 0 as a reverse proxy to the upstream at $2, with
# limit_req at $1 r/s and a burst of as many (nodelay, status 429).
start_nginx() {
    local rate=$1 upstream=${2#http://} prefix="$work/nginx" attempt
    mkdir -p "$prefix/logs" "$prefix/tmp"
    # The port may be taken between the check and nginx's bind: then try another.
    for ((attempt = 0; attempt < 5; attempt++)); do
        nginx_port=$(free_port)
        : >"$prefix/logs/error.log"
        write_nginx_config "$prefix" "$nginx_port" "$rate" "$upstream"
        # taskset execs nginx: $! is the master's PID; the worker inherits CPU 0.
        taskset -c 0 "$nginx_bin" -p "$prefix" -e "$prefix/logs/error.log" -c "$prefix/nginx.conf" \
            >/dev/null 2>"$prefix/logs/stderr" &
        if await_url nginx "$!" nginx_url; then
            pids+=($!)
            return
        fi
        grep -q "Address already in use" "$prefix/logs/error.log" || break
    done
    exited nginx "$prefix/logs/error.log"
}

# Starts configuration $1 and sets `url` once it answers.
start_server() {
    local mode=$1 upstream
    case $mode in
        rocgate-serve-* | nginx-*)
            start_bench_server bare 1
            upstream=$url
            case $mode in
                rocgate-serve-admit) start_rocgate_serve 2000000 "$upstream" ;;
                rocgate-serve-reject) start_rocgate_serve 1 "$upstream" ;;
                nginx-admit) start_nginx 2000000 "$upstream" ;;
                nginx-reject) start_nginx 1 "$upstream" ;;
            esac
            ;;
        *) start_bench_server "$mode" 0 ;;
    esac
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
        if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2
    }'
}

# CPU ticks (USER_HZ) the processes of the configuration and their children (nginx's
# worker) have used, user and system.
proc_ticks() {
    local pid all=()
    for pid in "${pids[@]}"; do
        all+=("/proc/$pid/stat")
        for child in $(pgrep -P "$pid" || true); do all+=("/proc/$child/stat"); done
    done
    awk '{ t += $14 + $15 } END { print t + 0 }' "${all[@]}" 2>/dev/null || echo 0
}

HZ=$(getconf CLK_TCK)

# One measurement of configuration $1. Sets r (req/s), l (wrk's p99), cpu (CPU time
# the configuration's processes used per request, in µs), total, bad
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
    s1=$(proc_ticks)
    local TIMEFORMAT='%U %S'
    { time timeout $((DURATION + 30)) taskset -c 1 \
        wrk -t1 -c64 -d"${DURATION}s" --latency "$url/" >"$work/wrk.out" 2>&1; } 2>"$work/wrk.time"
    s2=$(proc_ticks)
    read -r i2 t2 < <(cpu_times)
    stop_server
    cpu_ticks=$((s2 - s1))
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
    cpu=$(awk -v t="$cpu_ticks" -v hz="$HZ" -v n="$total" 'BEGIN { printf "%.3f", 1e6 * t / hz / n }')
}

declare -A rps p99
n=${#CONFIGS[@]}
echo "$ROUNDS rounds x $n configurations x ${DURATION}s (+${WARMUP}s warm-up each)"
echo
printf '%-6s %-24s %10s %9s %8s %8s %7s %7s  %s\n' round configuration req/s "p99 us" \
    "cpu us" non-2xx busy others "socket errors"
noisy=0
# Measures configuration $1 in round $2 (again while others exceed OTHERS_MAX, up to
# RETRIES times), prints the run and records it.
run() {
    local mode=$1 round=$2 attempt
    for ((attempt = 0; ; attempt++)); do
        measure "$mode"
        ((others > OTHERS_MAX && attempt < RETRIES)) || break
        printf '%-6s %-24s %10.0f  (discarded: others used %s%% of a CPU; retrying)\n' \
            "$round" "$mode" "$r" "$others"
    done
    ((others <= OTHERS_MAX)) || noisy=$((noisy + 1))
    printf '%-6s %-24s %10.0f %9s %8s %8s %6s%% %6s%%  %s\n' "$round" "$mode" "$r" "$(to_us "$l")" \
        "$cpu" "$(awk -v b="${bad:-0}" -v t="$total" 'BEGIN { printf "%.1f%%", 100 * b / t }')" \
        "$busy" "$others" "${errors:-none}"
}
declare -A paired cpus paired_cpu
# paired and paired_cpu are read through ratio_of's namerefs.
# shellcheck disable=SC2034
for ((round = 1; round <= ROUNDS; round++)); do
    for ((i = 0; i < n; i++)); do
        mode=${CONFIGS[(i + round - 1) % n]}
        pair=0
        if ((PAIRED)) && [[ $mode != bare ]] && is_layer_config "$mode"; then
            pair=1
        fi
        # The pair's bare run goes first in odd rounds and second in even ones, so
        # that whatever the second run of a pair suffers cancels out over the rounds.
        if ((pair && round % 2 == 1)); then
            run bare "$round"
            paired[$mode,$round]=$r
            paired_cpu[$mode,$round]=$cpu
        fi
        run "$mode" "$round"
        rps[$mode,$round]=$r
        p99[$mode,$round]=$(to_us "$l")
        cpus[$mode,$round]=$cpu
        if ((pair && round % 2 == 0)); then
            run bare "$round"
            paired[$mode,$round]=$r
            paired_cpu[$mode,$round]=$cpu
        fi
        if [[ $mode == bare ]]; then
            paired[$mode,$round]=$r
            paired_cpu[$mode,$round]=$cpu
        fi
    done
done

declare -A med_rps med_p99 med_cpu
for mode in "${CONFIGS[@]}"; do
    rs=() ls=() cs=()
    for ((round = 1; round <= ROUNDS; round++)); do
        rs+=("${rps[$mode,$round]}")
        ls+=("${p99[$mode,$round]}")
        cs+=("${cpus[$mode,$round]}")
    done
    med_rps[$mode]=$(median "${rs[@]}")
    med_p99[$mode]=$(median "${ls[@]}")
    med_cpu[$mode]=$(median "${cs[@]}")
done

# X ÷ bare for configuration $1, as a throughput, from the runs in array $2, the bare
# runs paired with them in $3 and the medians in $4; with $5 = 1 the measure is a cost
# (CPU per request), so the ratio is bare's over X's: what X's req/s would be, as a
# fraction of bare's, on a saturated core, whether or not wrk keeps up. With PAIRED=1,
# the median over rounds of X against the bare run beside it; otherwise the ratio
# of the medians.
ratio_of() {
    local -n runs=$2 beside=$3 medians=$4
    local round rs=() expr='a / b'
    ((${5:-0})) && expr='b / a'
    if ((PAIRED)); then
        for ((round = 1; round <= ROUNDS; round++)); do
            rs+=("$(awk -v a="${runs[$1,$round]}" -v b="${beside[$1,$round]}" "BEGIN { print $expr }")")
        done
        awk -v m="$(median "${rs[@]}")" 'BEGIN { printf "%.3f", m }'
    else
        awk -v a="${medians[$1]}" -v b="${medians[bare]}" "BEGIN { printf \"%.3f\", $expr }"
    fi
}
ratio() { ratio_of "$1" rps paired med_rps; }
cpu_ratio() { ratio_of "$1" cpus paired_cpu med_cpu 1; }
verdict() { awk -v r="$1" -v t="$2" 'BEGIN { print (r >= t ? "met" : "MISSED") }'; }

if has_config bare; then
    echo
    echo "medians over $ROUNDS rounds (server on 1 core, wrk -t1 -c64 -d${DURATION}s on the other):"
    printf '%-24s %12s %12s %10s %10s %12s\n' configuration req/s "p99 us" "x bare" \
        "cpu us" "cpu x bare"
    for mode in "${LAYER_CONFIGS[@]}"; do
        has_config "$mode" || continue
        printf '%-24s %12.0f %12.0f %10s %10s %12s\n' "$mode" "${med_rps[$mode]}" \
            "${med_p99[$mode]}" "$(ratio "$mode")" "${med_cpu[$mode]}" "$(cpu_ratio "$mode")"
    done

    echo
    echo "(x bare: req/s over bare's; cpu x bare: bare's CPU per request over this one's)"
    for placement in "" -outside; do
        for kind in admit reject; do
            has_config "rocgate-$kind$placement" || continue
            target=0.97
            [[ $kind == reject ]] && target=0.95
            a=$(ratio "rocgate-$kind$placement")
            c=$(cpu_ratio "rocgate-$kind$placement")
            echo "rocgate-$kind$placement ÷ bare: req/s $a, cpu $c (target >= $target:" \
                "req/s $(verdict "$a" "$target"), cpu $(verdict "$c" "$target"))"
        done
    done
fi

if has_config nginx-admit || has_config rocgate-serve-admit || has_config nginx-reject ||
    has_config rocgate-serve-reject; then
    echo
    echo "medians over $ROUNDS rounds (proxy on CPU 0; upstream and wrk -t1 -c64 -d${DURATION}s on CPU 1):"
    printf '%-24s %12s %12s\n' configuration req/s "p99 us"
    for mode in "${PROXY_CONFIGS[@]}"; do
        has_config "$mode" || continue
        printf '%-24s %12.0f %12.0f\n' "$mode" "${med_rps[$mode]}" "${med_p99[$mode]}"
    done
    echo
    for case in admit reject; do
        if ! has_config "rocgate-serve-$case" || ! has_config "nginx-$case"; then continue; fi
        rr=$(awk -v a="${med_rps[rocgate-serve-$case]}" -v b="${med_rps[nginx-$case]}" 'BEGIN { printf "%.3f", a / b }')
        rl=$(awk -v a="${med_p99[rocgate-serve-$case]}" -v b="${med_p99[nginx-$case]}" 'BEGIN { printf "%.3f", a / b }')
        lat=$(awk -v r="$rl" 'BEGIN { print (r <= 1 ? "met" : "MISSED") }')
        echo "rocgate serve ÷ nginx, $case: req/s $rr (target >= 1: $(verdict "$rr" 1)), p99 $rl (target <= 1: $lat)"
    done
fi
if ((noisy > 0)); then
    echo "warning: in $noisy runs other processes used more than ${OTHERS_MAX}% of a CPU: do not trust these ratios" >&2
fi
