# shellcheck shell=bash
# Sourced by the benchmark scripts (bench-http.sh, bench-ab.sh, callgrind-http.sh,
# proxy-ab.sh, bench-cap.sh): installing the Debian packages they need, a temporary
# directory, waiting for a server to answer, and stopping the processes they started,
# by PID only.

# Installs the Debian packages named, if any (fetching the package lists again if the
# first attempt fails).
install_packages() {
    (($# == 0)) && return
    echo "installing $*"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "$@" >/dev/null ||
        { apt-get update -q >/dev/null && apt-get install -y -q "$@" >/dev/null; }
}

# Kills each process whose PID is given, and waits for it to exit.
reap() {
    local pid
    for pid in "$@"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}

# Sets `work` to a new temporary directory and `pids` to none; on exit (Ctrl-C too)
# reaps every PID then in `pids` and removes `work`.
work_reaped_on_exit() {
    work=$(mktemp -d)
    pids=()
    trap 'reap "${pids[@]}"; rm -rf "$work"' EXIT
    trap 'exit 130' INT TERM
}

# Waits up to 10 s for the function $1 to print a URL that answers, and prints it; $2
# names what should answer, for the error.
await_url() {
    local url
    for _ in $(seq 100); do
        url=$($1)
        if [[ -n $url ]] && curl -s -o /dev/null --max-time 1 "$url/"; then
            echo "$url"
            return 0
        fi
        sleep 0.1
    done
    echo "$(basename "$0" .sh): $2 did not answer within 10 s" >&2
    return 1
}

# The URL examples/bench_server printed to $work/upstream.out, once it has.
upstream_url() { sed -n 's/^listening on //p' "$work/upstream.out"; }
