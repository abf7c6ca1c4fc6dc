# shellcheck shell=bash
# Sourced by the benchmark scripts (bench-http.sh, bench-ab.sh, callgrind-http.sh,
# proxy-ab.sh): installing the Debian packages they need, and stopping the processes
# they started, by PID only.

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
