# Sourced by the benchmark scripts (bench-http.sh, bench-ab.sh, callgrind-http.sh):
# stopping the processes they started, by PID only.

# Kills each process whose PID is given, and waits for it to exit.
reap() {
    local pid
    for pid in "$@"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}
