#!/usr/bin/env bash
# Installs the system libraries napkin's default build links against: OpenBLAS (the fast CPU
# GEMM behind `--device cpu`). Safe to run repeatedly; does nothing when already present.
# Without root or apt, it says what to install (or build with --no-default-features).
set -euo pipefail

have_openblas() {
    ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so ' ||
        ls /usr/lib/*/libopenblas.so /usr/lib/libopenblas.so >/dev/null 2>&1
}

if have_openblas; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing libopenblas-dev (OpenBLAS, for the fast CPU backend)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas-dev >/dev/null
    have_openblas && exit 0
fi
cat >&2 <<MSG
error: OpenBLAS was not found and could not be installed automatically.
  Debian/Ubuntu: sudo apt-get install libopenblas-dev
  Fedora:        sudo dnf install openblas-devel
  macOS:         brew install openblas
Or build the pure-Rust CPU backend instead: cargo build --release -p napkin --no-default-features
MSG
exit 1
