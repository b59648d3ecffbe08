#!/usr/bin/env bash
# Builds the browser sandbox into web/dist: the wasm32 target and the wasm-bindgen CLI at the
# version Cargo.lock pins (installed into cargo's bin folder when missing or different), a
# release build of napkin-web (the page's module, CPU training), a second release build with
# the `webgpu` feature (napkin_web_gpu: burn wgpu, fetched by the worker only for a WebGPU
# run; NAPKIN_WEBGPU=0 skips it), the JS glue, the static files, and — when
# NAPKIN_WASM_OPT=1 — `wasm-opt -Oz` from the npm package binaryen (default features only:
# `--all-features` produced a module Chrome rejects). Prints the bundle size.
# Usage: scripts/ci/web-build.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
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
    echo "installing wasm-bindgen-cli $bindgen_version (matches the crate; about a minute, once)..."
    # Not --locked: one of its locked dependencies (webpki-roots 1.0.11) is not on every
    # registry mirror; the same version resolves with the newest compatible ones.
    # --debug: unoptimised it compiles in 112 s of a 2-core machine instead of 570 s (488 s at
    # opt-level 1) and binds a 19 MB module in 19 s instead of 2 s, to the same bytes
    # (docs/ci.md): CI installs it on every fresh machine and binds three modules at most.
    cargo install --quiet --debug wasm-bindgen-cli --version "$bindgen_version"
fi

tmp=$(mktemp -d "$root/web/.dist.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
built=target/wasm32-unknown-unknown/release/napkin_web.wasm

echo "building napkin-web for wasm32 (release)..."
cargo build --quiet --locked --release -p napkin-web --target wasm32-unknown-unknown
# --remove-name-section: the function names only label stack traces (850 KB of the CPU module,
# 6.6 MB of the WebGPU one); a panic's message still reaches the console.
bindgen=(wasm-bindgen --target web --no-typescript --remove-name-section)
"${bindgen[@]}" --out-dir "$tmp" "$built"
modules=(napkin_web)
# The real-model mode's module: the same crate with the GGUF reader, tokenizer and chat
# templates linked in (napkin-core is shared with the first build: only napkin-web relinks).
echo "building the real-model module (napkin-web --features teach, release)..."
cargo build --quiet --locked --release -p napkin-web --features teach \
    --target wasm32-unknown-unknown
"${bindgen[@]}" --out-dir "$tmp" --out-name napkin_web_teach "$built"
modules+=(napkin_web_teach)
if [ "${NAPKIN_WEBGPU:-1}" = 1 ]; then
    # Same crate and output file, other features: bind it before anything overwrites it.
    # With `teach` too: the real-model mode on WebGPU runs from this module.
    echo "building the WebGPU module (napkin-web --features webgpu,teach, release)..."
    cargo build --quiet --locked --release -p napkin-web --features webgpu,teach \
        --target wasm32-unknown-unknown
    "${bindgen[@]}" --out-dir "$tmp" --out-name napkin_web_gpu "$built"
    modules+=(napkin_web_gpu)
fi
# The page's feature sets linted (wasm32 cfgs the native build never sees): a check pass of the
# workspace's crates on the dependencies just built, a warning fails it. Not through
# clippy-driver in the builds themselves, as the native tests are: clippy compiles without MIR
# optimisations, which made the CPU module 13.7 KB (gzipped) larger.
if command -v cargo-clippy >/dev/null || cargo clippy --version >/dev/null 2>&1; then
    echo "linting the page's feature sets (clippy, wasm32)..."
    features=("" "teach")
    [ "${NAPKIN_WEBGPU:-1}" = 1 ] && features+=("webgpu,teach")
    for f in "${features[@]}"; do
        cargo clippy --quiet --locked --release -p napkin-web --target wasm32-unknown-unknown \
            ${f:+--features "$f"} -- -D warnings
    done
else
    echo "note: clippy not found (rustup component add clippy): the page's builds are not linted"
fi
if [ "${NAPKIN_WASM_OPT:-0}" = 1 ]; then
    echo "optimising with wasm-opt -Oz (npm binaryen)..."
    (cd "$root/web/e2e" && npm ci --silent --no-audit --no-fund)
    for module in "${modules[@]}"; do
        "$root/web/e2e/node_modules/.bin/wasm-opt" -Oz "$tmp/${module}_bg.wasm" -o "$tmp/opt.wasm"
        mv "$tmp/opt.wasm" "$tmp/${module}_bg.wasm"
    done
fi
# Content-hashed names for the modules and their glue (napkin_web_bg.<hash>.wasm,
# napkin_web.<hash>.js): a server may tell browsers to keep them for a year (web/serve.mjs
# marks them immutable), and a rebuilt module can never be served stale because its name
# changes. The glue names its wasm, and main.js, worker.js and sw.js name the glue: each
# reference is rewritten, and the build stops if one is not found. The small files that name
# them (index.html, main.js, worker.js, sw.js, style.css) keep their names and are revalidated.
hash12() { sha256sum "$1" | cut -c1-12; }
renames=()
for module in "${modules[@]}"; do
    wasm_name="${module}_bg.$(hash12 "$tmp/${module}_bg.wasm").wasm"
    mv "$tmp/${module}_bg.wasm" "$tmp/$wasm_name"
    sed -i "s/'${module}_bg\.wasm'/'$wasm_name'/g" "$tmp/${module}.js"
    if ! grep -qF "'$wasm_name'" "$tmp/${module}.js"; then
        echo "error: ${module}.js does not name ${module}_bg.wasm (wasm-bindgen's glue changed?)" >&2
        exit 1
    fi
    glue_name="${module}.$(hash12 "$tmp/${module}.js").js"
    mv "$tmp/${module}.js" "$tmp/$glue_name"
    renames+=(-e "s#\./${module}\.js'#./$glue_name'#g" -e "s#\./${module}_bg\.wasm'#./$wasm_name'#g")
done
cp web/static/* "$tmp/"
sed -i "${renames[@]}" "$tmp/main.js" "$tmp/worker.js" "$tmp/sw.js"
# The service worker's cache is named after this build: a new build's worker drops the old
# copies when it takes over (the model file has a cache of its own and stays).
sed -i "s/napkin-sandbox-dev/napkin-sandbox-$(cat "$tmp"/*.js | sha256sum | cut -c1-12)/" "$tmp/sw.js"
for module in "${modules[@]}"; do
    if grep -qF "./${module}.js'" "$tmp/main.js" "$tmp/worker.js" "$tmp/sw.js"; then
        echo "error: a reference to ${module}.js was left unrenamed" >&2
        exit 1
    fi
done
rm -rf "$dist"
mv "$tmp" "$dist"
trap - EXIT

total=$(du -cb "$dist"/* | tail -1 | cut -f1)
echo "bundle: web/dist, $total bytes"
# Brotli and gzip copies for web/serve.mjs (and any static server) to send compressed.
if command -v node >/dev/null; then
    node "$root/web/compress.mjs" "$dist" | tail -n 1
else
    echo "(node not found: no precompressed .br/.gz files; the page is served uncompressed)"
fi
# The real-model mode's checkpoint, when scripts/fetch/smollm2.sh has brought it: linked (not
# copied) into dist/models/, where the page asks for it. Without it the page says so and
# offers a file picker.
model="SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$root/models/$model" ]; then
    mkdir -p "$dist/models"
    ln -f "$root/models/$model" "$dist/models/$model" 2>/dev/null \
        || cp "$root/models/$model" "$dist/models/$model"
    echo "  models/$model: served for the real-model mode"
else
    echo "  (models/$model not found: run scripts/fetch/smollm2.sh for the real-model mode)"
fi
for module in "${modules[@]}"; do
    wasm=$(echo "$dist/${module}"_bg.*.wasm)
    wasm_bytes=$(stat -c %s "$wasm")
    gzip_bytes=$(gzip -9 -c "$wasm" | wc -c)
    echo "  ${wasm##*/}: $wasm_bytes bytes ($gzip_bytes gzipped)"
done
