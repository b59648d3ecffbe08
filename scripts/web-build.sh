#!/usr/bin/env bash
# Builds the browser sandbox into web/dist: the wasm32 target and the wasm-bindgen CLI at the
# version Cargo.lock pins (installed into cargo's bin folder when missing or different), a
# release build of napkin-web, the JS glue, the static files, and — when NAPKIN_WASM_OPT=1 —
# `wasm-opt -Oz` from the npm package binaryen (default features only: `--all-features`
# produced a module Chrome rejects). Prints the bundle size.
# Usage: scripts/web-build.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
dist="$root/web/dist"

bindgen_version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
if [ -z "$bindgen_version" ]; then
    echo "error: Cargo.lock names no wasm-bindgen version" >&2
    exit 1
fi

if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    echo "installing the Rust target wasm32-unknown-unknown..."
    rustup target add wasm32-unknown-unknown
fi

if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$bindgen_version" ]; then
    echo "installing wasm-bindgen-cli $bindgen_version (matches the crate; several minutes, once)..."
    # Not --locked: one of its locked dependencies (webpki-roots 1.0.11) is not on every
    # registry mirror; the same version resolves with the newest compatible ones.
    cargo install --quiet wasm-bindgen-cli --version "$bindgen_version"
fi

echo "building napkin-web for wasm32 (release)..."
cargo build --quiet --locked --release -p napkin-web --target wasm32-unknown-unknown

tmp=$(mktemp -d "$root/web/.dist.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
wasm-bindgen --target web --no-typescript --out-dir "$tmp" \
    target/wasm32-unknown-unknown/release/napkin_web.wasm
if [ "${NAPKIN_WASM_OPT:-0}" = 1 ]; then
    echo "optimising with wasm-opt -Oz (npm binaryen)..."
    (cd "$root/web/e2e" && npm ci --silent --no-audit --no-fund)
    "$root/web/e2e/node_modules/.bin/wasm-opt" -Oz "$tmp/napkin_web_bg.wasm" -o "$tmp/opt.wasm"
    mv "$tmp/opt.wasm" "$tmp/napkin_web_bg.wasm"
fi
cp web/static/* "$tmp/"
rm -rf "$dist"
mv "$tmp" "$dist"
trap - EXIT

wasm_bytes=$(stat -c %s "$dist/napkin_web_bg.wasm")
gzip_bytes=$(gzip -9 -c "$dist/napkin_web_bg.wasm" | wc -c)
total=$(du -cb "$dist"/* | tail -1 | cut -f1)
echo "bundle: web/dist, $total bytes; the module $wasm_bytes bytes ($gzip_bytes gzipped)"
