# shellcheck shell=bash
# Sourced by the benchmark scripts (bench-http.sh, bench-ab.sh, callgrind-http.sh,
# proxy-ab.sh, bench-cap.sh): installing the Debian packages they need, a temporary
# directory, and stopping the processes they started, by PID only.

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
