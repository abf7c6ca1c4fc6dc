#!/usr/bin/env bash
# Explores the property tests with fresh cases, for a bounded time.
#
#   scripts/explore-properties.sh [MINUTES]      (default 10)
#
# scripts/test.sh (and so CI) draws the property tests' cases from one fixed seed. This
# runs tests/properties.rs, tests/limiter_properties.rs and tests/parser_properties.rs
# again and again, each run from a new seed and with PROPTEST_CASES cases per property
# (default 2000), until MINUTES have passed or a run fails. A failure's case is written
# to the test's `.proptest-regressions` file (keep it, with the fix), and the seed
# printed replays the whole run. Runs under nice: the machine stays usable.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes="${1:-10}"
case "$minutes" in
    *[!0-9]* | "" | 0)
        echo "usage: $0 [MINUTES] (a whole number ≥ 1)" >&2
        exit 2
        ;;
esac
export PROPTEST_CASES="${PROPTEST_CASES:-2000}"
targets=(properties limiter_properties parser_properties)

cargo test --all-features "${targets[@]/#/--test=}" --no-run --quiet
end=$(($(date +%s) + minutes * 60))
runs=0
while [ "$(date +%s)" -lt "$end" ]; do
    for target in "${targets[@]}"; do
        seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
        runs=$((runs + 1))
        echo "run $runs: --test $target, PROPTEST_RNG_SEED=$seed, $PROPTEST_CASES cases"
        # A run is bounded too: a property that hangs is a failure.
        if ! PROPTEST_RNG_SEED="$seed" timeout 600 nice -n 10 \
            cargo test --all-features --quiet --test "$target"; then
            echo
            echo "failed; replay the run with:"
            echo "  PROPTEST_RNG_SEED=$seed PROPTEST_CASES=$PROPTEST_CASES cargo test --all-features --test $target"
            exit 1
        fi
    done
done
echo "no failure in $runs runs of $PROPTEST_CASES cases per property ($minutes min)"
