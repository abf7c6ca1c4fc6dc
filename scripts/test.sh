#!/usr/bin/env bash
# The whole test suite, as README.md gives it and as CI runs it.
#
# Installs what the tests need that the machine lacks, then: the shell scripts
# checked, formatting, clippy with warnings as errors (every target, every feature),
# the core alone without default features, every test (unit, integration, doc; the
# property tests from a fixed seed), the loom model checks, and the API docs with
# warnings as errors (all features, and none).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "toolchain components"
for component in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^${component}"; then
        rustup component add "$component"
    fi
done

step "test dependencies (Debian packages)"
# Installs Debian packages (as root, or through sudo). Debian starts a packaged
# server's service at install on a systemd machine: one this script installed is
# stopped and disabled again, since the tests start their own on ports they pick
# (a Prometheus left on :9090 would take the port `rocgate serve`'s admin API uses).
install() {
    local as_root=()
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "the tests need the Debian packages $*: install them as root, or install sudo" >&2
            exit 2
        fi
        as_root=(sudo)
    fi
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "$@"
    if [ -d /run/systemd/system ]; then
        for service in "$@"; do
            case "$service" in prometheus | redis-server) ;; *) continue ;; esac
            if systemctl is-enabled --quiet "$service" 2>/dev/null; then
                echo "stopping and disabling the $service service the package started"
                "${as_root[@]}" systemctl disable --now --quiet "$service"
            fi
        done
    fi
}
# tests/prometheus.rs runs a real Prometheus and promtool.
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    install prometheus
fi
prometheus --version 2>&1 | head -n 1
# tests/redis_store.rs runs real redis-servers (the shared store), and builds Redis
# Clusters with redis-cli (package redis-tools).
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    install redis-server redis-tools
fi
redis-server --version
# The shell scripts are checked by shellcheck; scripts/bench.sh reads criterion's
# estimates with jq.
if ! command -v shellcheck >/dev/null 2>&1 || ! command -v jq >/dev/null 2>&1; then
    install shellcheck jq
fi
shellcheck --version | sed -n 2p

step "shellcheck (scripts/, .ci/run)"
shellcheck -x scripts/*.sh .ci/run

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, all features, -D warnings)"
cargo clippy --all-targets --all-features -- -D warnings

step "the core alone: cargo check --lib --no-default-features"
cargo check --lib --no-default-features

# Each adapter feature on its own builds without a warning: the default and
# all-features builds above do not see an item that only one feature leaves unused.
for feature in metrics http redis proxy charts gzip demo; do
    step "the library with --features $feature alone (clippy -D warnings)"
    cargo clippy --lib --no-default-features --features "$feature" -- -D warnings
done

step "cargo test --all-features"
# The property tests draw their cases from a fixed seed, so that every run tries the
# same cases: a case never drawn before cannot fail CI. Their regression files run
# first all the same. PROPTEST_RNG_SEED=<n> draws from another seed and
# PROPTEST_RNG_SEED=random fresh cases; scripts/explore-properties.sh explores.
PROPTEST_RNG_SEED="${PROPTEST_RNG_SEED:-1}"
case "$PROPTEST_RNG_SEED" in
    random) unset PROPTEST_RNG_SEED ;;
    *[!0-9]* | "")
        echo "PROPTEST_RNG_SEED must be a number (a u64) or random, got $PROPTEST_RNG_SEED" >&2
        exit 2
        ;;
    *) export PROPTEST_RNG_SEED ;;
esac
echo "property tests: PROPTEST_RNG_SEED=${PROPTEST_RNG_SEED:-random}"
cargo test --all-features

step "loom model checks (tests/loom.rs)"
# The lock-free core with its atomics swapped for loom's (src/sync.rs), every
# interleaving of a few threads within a preemption bound; README "Model checking
# (loom)". The cfg applies to every crate, so it builds in a target dir of its own
# (the main build is not invalidated) and without default features (the core alone;
# its dev-dependencies are left out under the cfg, see Cargo.toml).
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo test --release --no-default-features --test loom

step "cargo doc (-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features --quiet

step "cargo doc without default features (-D warnings)"
# The docs of the core alone: a link to an item behind a feature breaks here only.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --no-default-features --quiet

echo
echo "all checks passed"
