#!/usr/bin/env bash
# Soak of `rocgate serve` as a process: sustained churn for a while, then a check that
# nothing it held for the churn is still held once the clients are gone.
#
# Starts, on 127.0.0.1 and ports the OS picks:
#   - the upstream, examples/soak_peer.rs (`upstream`): `/P/slow` answers after 300 ms,
#     `/P/drip` streams 10 chunks over 0.9 s, `POST /P/upload` reads its body,
#     `/P/ws` echoes WebSocket messages, anything else answers `ok`;
#   - `rocgate serve` with a generated config: a token bucket that admits nearly all
#     (`/tb`), a route partitioned by `x-api-key` (`/keys`, 1,000 keys at most, drawn
#     from 20,000, idle after 10 s), `concurrency` with a queue (`/conc`), a leaky
#     bucket with a queue (`/leaky`), a tight token bucket that refuses most uploads
#     (`/tight`: lingering closes), WebSockets on a `concurrency` route of their own
#     (`/ws`), and a catch-all; short idle, header, lingering and upstream timeouts,
#     and a hints history kept for 1 minute (it fills up to `keep`, by design: kept
#     short, it is full before the second half of the run);
# and then drives it for SECONDS (default 180) with:
#   - wrk in bursts (a flash sale: BURST seconds on, PAUSE off; each burst opens its
#     connections anew) over every route and 20,000 API keys;
#   - soak_peer `churn`: CLIENTS clients that each cycle through keep-alive and h2c
#     requests, and requests aborted mid-head, mid-upload, while queued on `/conc`,
#     mid-response (a close or a reset), refused uploads sent whole or stalled
#     halfway, WebSockets closed and WebSockets dropped;
#   - a reload every RELOAD seconds (SIGHUP and POST /admin/reload in turn) that
#     renames every route but the two concurrency routes (three names each, in
#     rotation), and changes the `hold` of `/conc`, whose live state (its permits)
#     carries over;
#   - a `PUT /admin/routes/…` every second (and a DELETE of the change every fifth),
#     `GET /admin/routes` and a gzip `/metrics` scrape.
# Every SAMPLE seconds it records the proxy's open file descriptors
# (/proc/PID/fd), RSS (VmRSS), threads, and from /metrics the requests in flight, client
# connections, upstream lanes, upstream requests, lingering connections, keys tracked
# and the concurrency routes' permits held (CSV in OUT, default
# target/soak-serve/samples.csv; left empty where /metrics did not answer). Once
# traffic stops it waits SETTLE seconds (past the idle, lingering and upstream idle
# timeouts) and checks:
#   - the proxy still runs, and its /metrics answers (a gone or wedged proxy would
#     otherwise read as holding nothing);
#   - requests in flight, upstream requests, client connections, lanes, lingering
#     connections and concurrency permits are all 0;
#   - open file descriptors are back to their count before traffic, within FD_SLACK (4);
#   - every reload was applied;
#   - RSS over the second half of the traffic is flat: its least-squares slope, in
#     KiB per minute, is printed and must be under RSS_SLOPE_MAX (1024).
# Exits 0 if every check holds, 1 otherwise (each failure named).
#
# Usage:  scripts/soak-serve.sh                 (3 minutes of traffic, then SETTLE)
#         scripts/soak-serve.sh --seconds 900   (15 minutes)
#         CLIENTS=48 CONNECTIONS=64 scripts/soak-serve.sh --seconds 600
# Needs curl and wrk (installed with apt-get when missing). Loopback only; bounded in
# time (SECONDS + SETTLE + the build); every process it started is killed by its PID on
# exit, error or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/processes.sh
source scripts/processes.sh

run_seconds=180
while (($#)); do
    case $1 in
        --seconds)
            run_seconds=${2:-}
            shift 2 || { echo "soak-serve: --seconds takes a number" >&2; exit 2; }
            ;;
        *)
            echo "soak-serve: unknown argument '$1' (usage: scripts/soak-serve.sh [--seconds N])" >&2
            exit 2
            ;;
    esac
done
CLIENTS=${CLIENTS:-24}
CONNECTIONS=${CONNECTIONS:-32}
BURST=${BURST:-5}
PAUSE=${PAUSE:-3}
RELOAD=${RELOAD:-5}
SAMPLE=${SAMPLE:-5}
SETTLE=${SETTLE:-20}
FD_SLACK=${FD_SLACK:-4}
RSS_SLOPE_MAX=${RSS_SLOPE_MAX:-1024}
OUT=${OUT:-target/soak-serve}
for var in run_seconds CLIENTS CONNECTIONS BURST PAUSE RELOAD SAMPLE SETTLE FD_SLACK RSS_SLOPE_MAX; do
    if ! [[ ${!var} =~ ^[0-9]+$ ]]; then
        echo "soak-serve: $var must be a whole number, got '${!var}'" >&2
        exit 2
    fi
done
if ((run_seconds < 2 * SAMPLE || SAMPLE < 1 || RELOAD < 1 || BURST < 1)); then
    echo "soak-serve: --seconds must be at least 2 × SAMPLE ($SAMPLE), and SAMPLE, RELOAD, BURST at least 1" >&2
    exit 2
fi

missing=()
command -v curl >/dev/null || missing+=(curl)
command -v wrk >/dev/null || missing+=(wrk)
install_packages "${missing[@]}"

echo "building rocgate and examples/soak_peer.rs (release)"
cargo build --release --quiet --bin rocgate --example soak_peer
bin_dir=${CARGO_TARGET_DIR:-target}/release
rocgate=$bin_dir/rocgate
peer=$bin_dir/examples/soak_peer

work_reaped_on_exit
mkdir -p "$OUT"
samples=$OUT/samples.csv

# Waits up to 20 s for a line matching the sed expression $2 in file $1; prints it.
await_line() {
    local file=$1 expr=$2 found
    for _ in $(seq 200); do
        found=$(sed -n "$expr" "$file" | head -1)
        [[ -n $found ]] && { echo "$found"; return; }
        sleep 0.1
    done
    echo "soak-serve: gave up waiting for ${file##*/}:" >&2
    cat "$file" >&2
    exit 1
}

"$peer" upstream 127.0.0.1:0 >"$work/upstream.out" 2>&1 &
pids+=($!)
upstream=$(await_line "$work/upstream.out" 's/^listening on //p')

# Writes the config of generation $1: the concurrency routes keep their names and
# algorithm, and so their live state (permits held included), while `conc` changes
# its `hold`; the others are renamed (three names each in turn), which rebuilds them
# as new routes.
write_config() {
    local g=$(($1 % 3))
    cat >"$work/rocgate.toml.new" <<EOF
[defaults]
window = "2s"
slot = "100ms"
min_rps = 10

[[routes]]
name = "tb_$g"
path_prefix = "/tb"
base_limit = 5000
cut_limit = 5000

[[routes]]
name = "keys_$g"
path_prefix = "/keys"
base_limit = 5
cut_limit = 2
partition = "header:x-api-key"
max_keys = 1000
idle_timeout = "10s"

[[routes]]
name = "conc"
path_prefix = "/conc"
algorithm = "concurrency"
base_limit = 8
cut_limit = 4
queue = 16
hold = "$((1 + $1 % 2))s"

[[routes]]
name = "leaky_$g"
path_prefix = "/leaky"
algorithm = "leaky_bucket"
base_limit = 200
cut_limit = 100
queue = 20

[[routes]]
name = "tight_$g"
path_prefix = "/tight"
base_limit = 2
cut_limit = 1

[[routes]]
name = "ws"
path_prefix = "/ws"
algorithm = "concurrency"
base_limit = 20
cut_limit = 10

[[routes]]
name = "rest_$g"
path_prefix = "/"
base_limit = 100000
cut_limit = 100000

[server]
upstream = "$upstream"
header_read_timeout = "2s"
idle_timeout = "5s"
response_timeout = "3s"
upstream_idle_timeout = "2s"
lingering_time = "4s"
lingering_timeout = "1s"
max_body_bytes = 1048576

[hints]
interval = "10s"
keep = "1m"
EOF
    mv "$work/rocgate.toml.new" "$work/rocgate.toml"
}
write_config 0
"$rocgate" check-config "$work/rocgate.toml" >/dev/null

RUST_LOG=warn,rocgate::cli=info "$rocgate" serve --config "$work/rocgate.toml" \
    --listen 127.0.0.1:0 --admin 127.0.0.1:0 2>"$work/serve.err" &
serve_pid=$!
pids+=("$serve_pid")
proxy=$(await_line "$work/serve.err" 's/.*listen=\([0-9.:]*\).*/\1/p')
admin=$(await_line "$work/serve.err" 's/.*admin=\([0-9.:]*\).*/\1/p')
echo "upstream $upstream, rocgate serve pid $serve_pid on $proxy, admin $admin"

# Scrapes /metrics into $work/metrics; fails, the file left empty, without an answer in
# 5 s.
scrape() { curl -sf --max-time 5 "http://$admin/metrics" >"$work/metrics" || { : >"$work/metrics"; return 1; }; }
# The sum of the series of metric $1 (whose labels match the regex $2, if given) in
# the last scrape.
metric() {
    awk -v name="$1" -v labels="${2:-}" '
        index($1, name) == 1 && (substr($1, length(name) + 1, 1) == "{" || length($1) == length(name)) \
            && $1 ~ labels { sum += $NF }
        END { printf "%d\n", sum }' "$work/metrics"
}
# The proxy's open fds, and a field of its /proc status: 0 and empty once it is gone
# (which the checks name, rather than stop the script on).
fds() { find "/proc/$serve_pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l || true; }
status_field() { awk -v f="$1:" '$1 == f { print $2 }' "/proc/$serve_pid/status" 2>/dev/null || true; }
# Whether the proxy is still running (not gone, not a zombie).
serving() {
    local state
    state=$(status_field State)
    [[ -n $state && $state != Z ]]
}

start=$(date +%s)
echo "t,phase,fds,rss_kib,threads,in_flight,client_connections,upstream_lanes,upstream_requests,lingering,keys,concurrency_permits" >"$samples"
# Appends one sample, in phase $1, to the CSV and prints it. The gauges of a scrape
# that got no answer are left empty: unknown, not 0.
sample() {
    local row
    row="$(($(date +%s) - start)),$1,$(fds),$(status_field VmRSS),$(status_field Threads)"
    if scrape; then
        row+=",$(metric rocgate_in_flight_requests),$(metric rocgate_client_connections)"
        row+=",$(metric rocgate_upstream_lanes),$(metric rocgate_upstream_requests)"
        row+=",$(metric rocgate_lingering_connections),$(metric rocgate_keys)"
        row+=",$(metric rocgate_limiter_level 'algorithm="concurrency"')"
    else
        row+=",,,,,,,"
    fi
    echo "$row" >>"$samples"
    echo "$row"
}
sample baseline
baseline_fds=$(fds)

cat >"$work/mix.lua" <<'EOF'
local paths = {"/tb/", "/keys/item", "/leaky/", "/conc/", "/other", "/tb/slow", "/tight/"}
local n = 0
request = function()
    n = n + 1
    local path = paths[n % #paths + 1]
    return wrk.format("GET", path, {["x-api-key"] = tostring(math.random(1, 20000))})
end
EOF

deadline=$((start + run_seconds))
# Bursts of wrk until the deadline.
(
    wrk_pid=
    trap '[[ -n $wrk_pid ]] && kill "$wrk_pid" 2>/dev/null; exit 0' TERM
    while (($(date +%s) + BURST <= deadline)); do
        wrk -t1 -c"$CONNECTIONS" -d"${BURST}s" -s "$work/mix.lua" "http://$proxy/" >>"$work/wrk.out" 2>&1 &
        wrk_pid=$!
        wait "$wrk_pid" || true
        wrk_pid=
        sleep "$PAUSE"
    done
) &
pids+=($!)
"$peer" churn "$proxy" "$run_seconds" "$CLIENTS" >"$work/churn.out" 2>&1 &
churn_pid=$!
pids+=("$churn_pid")
# Reloads renaming every route, and the admin API's changes and reads, until the deadline.
(
    generation=0
    tick=0
    while (($(date +%s) < deadline)); do
        sleep 1
        tick=$((tick + 1))
        route="tb_$((generation % 3))"
        curl -sf --max-time 5 -X PUT -d "{\"base_limit\": $((4000 + tick % 7 * 100))}" \
            "http://$admin/admin/routes/$route" >/dev/null || true
        if ((tick % 5 == 0)); then
            curl -sf --max-time 5 -X DELETE "http://$admin/admin/routes/$route/change" >/dev/null || true
        fi
        curl -sf --max-time 5 "http://$admin/admin/routes" >/dev/null || true
        curl -sf --max-time 5 --compressed "http://$admin/metrics" >/dev/null || true
        if ((tick % RELOAD == 0)); then
            generation=$((generation + 1))
            write_config "$generation"
            if ((generation % 2)); then
                kill -HUP "$serve_pid"
            else
                curl -sf --max-time 5 -X POST "http://$admin/admin/reload" >/dev/null || true
            fi
            echo "$generation" >"$work/reloads"
        fi
    done
) &
pids+=($!)

while (($(date +%s) < deadline)); do
    sleep "$SAMPLE"
    sample traffic
done
wait "$churn_pid" || true
sleep 1
settle_end=$(($(date +%s) + SETTLE))
while (($(date +%s) < settle_end)); do
    sleep "$SAMPLE"
    sample settle
done
final=$(tail -1 "$samples")
final_fds=$(fds)
if scrape; then
    applied=$(metric rocgate_config_reloads_total 'result="applied"')
    refused=$(metric rocgate_config_reloads_total 'result="refused"')
else
    applied=unknown refused=unknown
fi
reloads=$(cat "$work/reloads" 2>/dev/null || echo 0)

echo
echo "churn (soak_peer):"
cat "$work/churn.out"
echo "wrk bursts: $(grep -c 'Requests/sec' "$work/wrk.out" || true), requests $(awk '/requests in/ { s += $1 } END { print s + 0 }' "$work/wrk.out")"
echo "reloads asked $reloads, applied $applied, refused $refused"

failures=()
# A proxy that is gone reads as holding nothing (no fds, no RSS, every gauge empty).
serving || failures+=("rocgate serve (pid $serve_pid) is gone; its log ends: $(tail -3 "$work/serve.err" | tr '\n' ' ')")
IFS=, read -r _ _ _ _ _ in_flight conns lanes up_requests lingering keys permits <<<"$final"
for check in "in_flight:$in_flight" "client_connections:$conns" "upstream_lanes:$lanes" \
    "upstream_requests:$up_requests" "lingering:$lingering" "concurrency_permits:$permits"; do
    if [[ -z ${check#*:} ]]; then
        failures+=("${check%:*} unknown after traffic stopped: /metrics did not answer")
    elif ((${check#*:} != 0)); then
        failures+=("${check%:*} is ${check#*:} after traffic stopped, not 0")
    fi
done
echo "file descriptors: $baseline_fds before traffic, $final_fds after (slack $FD_SLACK)"
((final_fds <= baseline_fds + FD_SLACK)) ||
    failures+=("file descriptors: $final_fds after, $baseline_fds before")
[[ $applied == "$reloads" && $refused == 0 ]] ||
    failures+=("reloads: $reloads asked, $applied applied, $refused refused")
echo "keys tracked after settling: $keys"

# Least-squares slope of RSS (KiB) against time (minutes) over the second half of the
# traffic phase.
slope=$(awk -F, -v half="$((run_seconds / 2))" '
    $2 == "traffic" && $1 >= half { n++; x = $1 / 60; y = $4; sx += x; sy += y; sxx += x * x; sxy += x * y;
        if (n == 1 || y < lo) lo = y; if (y > hi) hi = y }
    END { d = n * sxx - sx * sx; if (n < 2 || d == 0) { print "NA"; exit }
        printf "%.0f %d %d %d\n", (n * sxy - sx * sy) / d, n, lo, hi }' "$samples")
if [[ $slope == NA ]]; then
    failures+=("RSS: too few samples in the second half to fit a slope")
else
    read -r kib_per_min n lo hi <<<"$slope"
    echo "RSS over the second half: $n samples, $lo–$hi KiB, slope $kib_per_min KiB/min (max $RSS_SLOPE_MAX)"
    ((kib_per_min < RSS_SLOPE_MAX)) || failures+=("RSS grows $kib_per_min KiB/min over the second half")
fi
echo "samples: $samples"
if ((${#failures[@]})); then
    printf 'soak-serve: FAILED: %s\n' "${failures[@]}" >&2
    exit 1
fi
echo "soak-serve: everything held for the churn was given back"
