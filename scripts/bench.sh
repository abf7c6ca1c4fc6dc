#!/usr/bin/env bash
# Runs the decision benchmarks (benches/check.rs) with bounded times, prints each
# median and the ratios the performance targets are stated in, then the same ratios
# timed in alternation (benches/interleaved.rs), then the memory figures
# (tests/memory.rs) and where criterion's report is. Needs jq. The machine is noisy:
# run it twice and compare before believing a ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v jq >/dev/null 2>&1; then
    echo "scripts/bench.sh needs jq: apt-get install jq (scripts/test.sh installs it)" >&2
    exit 2
fi

cargo bench --bench check -- --warm-up-time 1 --measurement-time 3

report="$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)/criterion"
median() { jq '.median.point_estimate' "$report/$1/new/estimates.json"; }
ratio() { awk -v a="$(median "$1")" -v b="$(median "$2")" 'BEGIN { printf "%6.2f", a / b }'; }

echo
echo "median ns per decision:"
for group in primitives route route_2_threads keyed_10k reject occupancy_1000rps window_1000rps; do
    for estimates in "$report/$group"/*/new/estimates.json; do
        bench="${estimates#"$report"/}"
        bench="${bench%/new/estimates.json}"
        printf '  %-45s %8.2f\n' "$bench" "$(median "$bench")"
    done
done

echo
echo "rocgate ÷ governor (route target: <= 1.5):"
row() { printf '  %-16s %22s %26s %29s\n' "$@"; }
row "" given_now/fake_clock monotonic_clock/std_clock monotonic_clock/quanta_clock
for group in route route_2_threads keyed_10k reject; do
    row "$group" \
        "$(ratio "$group/rocgate_given_now" "$group/governor_fake_clock")" \
        "$(ratio "$group/rocgate_monotonic_clock" "$group/governor_std_clock")" \
        "$(ratio "$group/rocgate_monotonic_clock" "$group/governor_quanta_clock")"
done
echo "timestamp queue ÷ rocgate at 1,000 req/s (target: >= 10):"
echo "  the decision, 1 thread                    $(ratio occupancy_1000rps/timestamp_log occupancy_1000rps/rocgate)"
echo "  the decision, 2 threads                   $(ratio occupancy_1000rps/timestamp_log_2_threads occupancy_1000rps/rocgate_2_threads)"
w=window_1000rps
echo "  the window, 1 thread                      $(ratio $w/timestamp_queue $w/slotted)"
echo "  the window, 2 threads, one virtual clock  $(ratio $w/timestamp_queue_2_threads $w/slotted_2_threads)"
echo "  the window, 2 threads, a clock each       $(ratio $w/timestamp_queue_2_own_clocks $w/slotted_2_own_clocks)"

echo
cargo bench --bench interleaved

echo
RUST_BACKTRACE=0 cargo test --release --test memory -- --nocapture --test-threads 1 \
    || echo "memory: a target is missed (see the failures above)"

echo
echo "criterion report: $report/report/index.html"
