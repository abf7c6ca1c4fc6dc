#!/usr/bin/env bash
# The cost of one heartbeat (`rocgate::store::redis::HEARTBEAT`) in Redis, against a
# set of 100, 1,000 and 10,000 live instances: redis-benchmark's p50 and rate for
# `EVALSHA` on one connection, on a redis-server of its own on a loopback port it
# picks (stopped at the end). With a git revision (`scripts/bench-heartbeat.sh
# HEAD~3`), that revision's script is timed too, in alternation with this one, twice
# each: a ratio from one run on this noisy machine.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in redis-server redis-cli redis-benchmark python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "scripts/bench-heartbeat.sh needs $tool (Debian: redis-server, redis-tools, python3)" >&2
        exit 2
    fi
done

# The script's body, from a revision's src/store/redis.rs read on stdin.
script_of() {
    python3 -c '
import sys
s = sys.stdin.read()
start = s.index("pub const HEARTBEAT: &str = r\"") + len("pub const HEARTBEAT: &str = r\"")
print(s[start:s.index("\";", start)])'
}

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
dir="$(mktemp -d)"
trap 'if [ -s "$dir/redis.pid" ]; then kill "$(cat "$dir/redis.pid")"; fi; rm -rf "$dir"' EXIT
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --pidfile "$dir/redis.pid" --dir "$dir" >/dev/null
for _ in $(seq 50); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
done

declare -A sha
sha[work-tree]="$(redis-cli -p "$port" script load "$(script_of <src/store/redis.rs)")"
versions=(work-tree)
if [ $# -gt 0 ]; then
    sha[$1]="$(redis-cli -p "$port" script load "$(git show "$1:src/store/redis.rs" | script_of)")"
    versions+=("$1")
fi

now_ms="$(redis-cli -p "$port" time | head -n 1)000"
for n in 100 1000 10000; do
    # Every member live for an hour: scored by its last beat's end (this version) or
    # start (before it), and named with its span (`/hb=`, read by the older scripts).
    python3 - "$n" "$now_ms" <<'EOF' | redis-cli -p "$port" >/dev/null
import sys
n, now = int(sys.argv[1]), int(sys.argv[2])
print("DEL set")
for first in range(0, n, 500):
    members = range(first, min(n, first + 500))
    print("ZADD set " + " ".join(f"{now + 3_600_000} m{k}/hb=3600000" for k in members))
EOF
    for round in 1 2; do
        for version in "${versions[@]}"; do
            result="$(redis-benchmark -p "$port" -c 1 -n "$((n >= 10000 ? 300 : 3000))" -q \
                evalsha "${sha[$version]}" 1 set me 3000 2>&1 | tr '\r' '\n' |
                grep 'requests per second' | tail -n 1)"
            printf '%6d members, round %d, %-12s %s\n' "$n" "$round" "$version" "${result#*: }"
        done
    done
done
