#!/usr/bin/env bash
# The kernels' memory safety, beyond what the ordinary tests see:
#
# 1. Miri (undefined behaviour: out-of-bounds accesses, aliasing, data races) on the kernels
#    crate's unit tests and its length tests (tests/lengths.rs), scalar tier only: Miri
#    interprets no SIMD intrinsics or inline assembly, so under it `KernelTier::available()`
#    reports the scalar tier alone and tests that call SIMD code directly are ignored.
# 2. AddressSanitizer on every test of the kernels crate, so on every SIMD tier this CPU has:
#    a vector load or store past a buffer is reported, where the ordinary tests only see the
#    values. std is rebuilt with the sanitizer (-Zbuild-std), in a target directory of its own.
#
# Needs the nightly toolchain (installs its miri and rust-src components if missing). Not part
# of `make test` (it takes minutes); run it after changing unsafe code in crates/kernels:
#
#     bash scripts/test-sanitizers.sh          # both
#     bash scripts/test-sanitizers.sh miri     # or one of them
#     bash scripts/test-sanitizers.sh asan
set -euo pipefail

cd "$(dirname "$0")/.."
what="${1:-all}"
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
host="$(rustc +nightly -vV | sed -n 's/^host: //p')"

if ! rustup +nightly component list --installed | grep -q '^miri'; then
    rustup +nightly component add miri rust-src
fi
if ! rustup +nightly component list --installed | grep -q '^rust-src'; then
    rustup +nightly component add rust-src
fi

if [[ "$what" == all || "$what" == miri ]]; then
    echo "== Miri: onebit-kernels, scalar tier"
    start=$SECONDS
    # Isolation stays on (no clock or file system outside Miri's own); the pool's threads
    # spin on Miri's virtual clock. Many seeds would cost minutes each: one schedule.
    MIRIFLAGS="${MIRIFLAGS:-}" cargo +nightly miri test -p onebit-kernels --lib --test lengths
    echo "== Miri: passed in $((SECONDS - start)) s"
fi

if [[ "$what" == all || "$what" == asan ]]; then
    echo "== AddressSanitizer: onebit-kernels, every tier of this CPU ($host)"
    start=$SECONDS
    # The sanitizer needs the target named (so build scripts and proc macros stay unsanitized)
    # and std rebuilt with it; its own target directory keeps the ordinary builds intact.
    RUSTFLAGS="-Zsanitizer=address" RUSTDOCFLAGS="-Zsanitizer=address" ASAN_OPTIONS="detect_leaks=0" \
        CARGO_TARGET_DIR="$target_dir/asan" \
        cargo +nightly test -Zbuild-std --target "$host" -p onebit-kernels --lib --tests
    echo "== AddressSanitizer: passed in $((SECONDS - start)) s"
fi
