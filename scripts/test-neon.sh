#!/usr/bin/env bash
# Cross-tests the kernels crate for aarch64 (the NEON tier against the scalar reference) under
# qemu's user-mode emulation, which implements NEON with the dot-product extension.
# Installs the cross toolchain where it can (rustup target, Debian's qemu-user and gcc);
# where it cannot, it says so and stops without failing: the x86 tiers are the required tests.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu

skip() { echo "warning: NEON cross-test skipped: $1" >&2; exit 0; }

if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
  timeout 180 rustup target add "$TARGET" || skip "cannot install the Rust target $TARGET"
fi
if ! command -v qemu-aarch64 >/dev/null || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    pkgs="qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
    # shellcheck disable=SC2086
    { timeout 600 apt-get install -y --no-install-recommends $pkgs \
      || { timeout 600 apt-get update && timeout 600 apt-get install -y --no-install-recommends $pkgs; }; } \
      >/dev/null || skip "cannot install qemu-user and gcc-aarch64-linux-gnu"
  else
    skip "qemu-aarch64 and aarch64-linux-gnu-gcc are not installed (Debian: qemu-user gcc-aarch64-linux-gnu)"
  fi
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo clippy --locked --target "$TARGET" -p onebit-kernels --all-targets -- -D warnings
cargo test --locked --target "$TARGET" -p onebit-kernels
