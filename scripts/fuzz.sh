#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers of untrusted and operator input, with
# cargo-fuzz (libFuzzer) on the stable toolchain: no sanitizer (`-s none`, which
# needs no nightly); a panic, a failed invariant, a timeout or an out-of-memory is
# still a crash.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      (default: 30 s each, every target)
#
# Targets are in fuzz/fuzz_targets/ (README.md, "Fuzzing", says what each covers).
# Runs one target at a time, one job, under nice. The corpus grows in fuzz/corpus/
# (kept between runs, not committed); a crash is written to fuzz/artifacts/<target>/
# and the script stops there (cargo fuzz prints the command that replays it). CI does
# not run this.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-30}"
case "$seconds" in
    *[!0-9]* | "" | 0)
        echo "usage: $0 [SECONDS] [TARGET...] (SECONDS a whole number ≥ 1)" >&2
        exit 2
        ;;
esac
shift || true

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi

# Seeds besides the corpus: fuzz/seeds/<target>/, and the shipped configs for the
# config target. Dictionaries (tokens the mutations splice in) are in fuzz/dicts/.
seeds() {
    if [ -d "fuzz/seeds/$1" ]; then
        echo "fuzz/seeds/$1"
    fi
    if [ "$1" = config ]; then
        echo config
    fi
}

for target in "${targets[@]}"; do
    printf '\n== %s (%s s)\n' "$target" "$seconds"
    mkdir -p "fuzz/corpus/$target"
    options=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
    if [ -f "fuzz/dicts/$target.dict" ]; then
        options+=(-dict="fuzz/dicts/$target.dict")
    fi
    # shellcheck disable=SC2046 # seeds: directory names without spaces
    nice cargo fuzz run -s none "$target" "fuzz/corpus/$target" $(seeds "$target") -- \
        "${options[@]}"
done
