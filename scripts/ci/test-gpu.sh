#!/usr/bin/env bash
# The GPU-backend tests: the wgpu test binary (`tests/tests/gpu`: NF4 resident on the device
# and dequantized there bit for bit, generation's few-row products read straight from the
# codes, no weight upload per step, 16-bit QLoRA, optimizer
# offload, QLoRA's NF4 backward, efficient attention, the step peak and the roofline probe on a
# device pool), `napkin measure --device wgpu` with offload and with QLoRA, a QLoRA run of
# `napkin train` and `napkin generate` on the device, a DPO run on the device, and the GPU benchmark's smoke case. With no GPU it installs Mesa's lavapipe (Debian
# `mesa-vulkan-drivers`, a Vulkan driver that runs on the CPU) and asks wgpu for Vulkan.
# The test binary and the CLI are built with the features scripts/test.sh gives the whole
# workspace (`napkin/wgpu`; `napkin-tests/wgpu` only adds this binary), so after its test step
# nothing but this binary compiles here (with two feature resolutions burn and cubecl compiled
# twice: 20.9 + 25.9 minutes cold on a slow 2-core machine, 2026-11-30). Run by test.sh, the
# test binary is linted as it compiles (test.sh's RUSTC_WORKSPACE_WRAPPER: clippy-driver).
# Usage: scripts/ci/test-gpu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

have_vulkan_driver() {
    compgen -G '/usr/share/vulkan/icd.d/*.json' >/dev/null ||
        compgen -G '/etc/vulkan/icd.d/*.json' >/dev/null
}

if ! have_vulkan_driver; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing mesa-vulkan-drivers (lavapipe: Vulkan on the CPU)..."
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers >/dev/null
    fi
    if ! have_vulkan_driver; then
        echo "error: no Vulkan driver found; install mesa-vulkan-drivers (Debian/Ubuntu) or a GPU driver" >&2
        exit 1
    fi
fi
export WGPU_BACKEND="${WGPU_BACKEND:-vulkan}"

# One feature resolution for both, the one scripts/test.sh's tests use: `cargo run -p napkin`
# alone would resolve another and rebuild burn.
gpu_build=(--workspace --locked --features napkin/wgpu,napkin-tests/wgpu)
cargo build "${gpu_build[@]}" --test gpu --bin napkin
napkin="${CARGO_TARGET_DIR:-target}/debug/napkin"

cargo test "${gpu_build[@]}" --test gpu -- --nocapture

# The same split as a user sees it (the tiny-smol preset, full fine-tuning, 2 steps).
"$napkin" measure --preset tiny-smol --device wgpu --offload optimizer --seq-len 64 --steps 2

# QLoRA on the device (NF4 codes resident there, dequantized by napkin's kernel per product).
"$napkin" measure --preset tiny-smol --device wgpu --lora-r 8 --nf4 --double-quant --seq-len 64 --steps 2

# QLoRA as a user runs it: `napkin train` on the device (3 steps on the tiny fixture), then the
# adapter's sampled generation on the device and on the CPU. Sampling at temperature 1 from a
# random model's nearly flat distribution turns any difference in the logits into different
# text, so the two must print the same tokens (the device reads the NF4 codes in its
# few-row products; the CPU its own quantized path).
fixtures="${NAPKIN_FIXTURES:-$(cd .. && pwd)/shared/fixtures}"
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
tiny=(--model "$fixtures/tiny-smol" --tokenizer "$fixtures/tokenizer/tokenizer.json")
"$napkin" train "${tiny[@]}" --chat-format chatml --data data/napkin-instruct.jsonl \
    --out "$run/out" --device wgpu --lora-r 8 --nf4 --double-quant --lr 3e-3 --seq-len 64 \
    --steps 3 --plain 2> "$run/train.err" || { cat "$run/train.err" >&2; exit 1; }
cat "$run/train.err" >&2
# Its steps 2 and 3 are replayed from a recorded device graph (train/captured.rs), as a user's
# run is by default.
if ! grep -q 'captured as a device graph' "$run/train.err"; then
    echo "error: napkin train on wgpu did not capture its step" >&2
    exit 1
fi
for device in wgpu cpu; do
    "$napkin" generate "${tiny[@]}" --adapter "$run/out" --prompt "Compute 3 + 63." \
        --max-new-tokens 24 --temperature 1 --seed 3 --device "$device" > "$run/$device.txt"
done
if ! cmp -s "$run/wgpu.txt" "$run/cpu.txt"; then
    echo "error: the QLoRA adapter's sampled text differs between wgpu and cpu:" >&2
    cat "$run/wgpu.txt" "$run/cpu.txt" >&2
    exit 1
fi

# DPO as a user runs it on the device: QLoRA with checkpointing on the shipped preference
# pairs, the reference forward and the label log-probabilities on the GPU (the cross-entropy
# kernel's rows). The adapters start at B = 0, so the first step's loss is log 2 exactly.
"$napkin" train "${tiny[@]}" --chat-format chatml --data data/napkin-preference.jsonl \
    --objective dpo --out "$run/dpo" --device wgpu --lora-r 8 --nf4 --checkpointing --lr 3e-3 \
    --seq-len 128 --micro-batch 2 --steps 2 --plain
if ! grep -q '"rewards/accuracies"' "$run/dpo/metrics.jsonl"; then
    echo "error: the DPO run on wgpu wrote no reward metrics" >&2
    exit 1
fi
first_loss=$(grep -m1 -oE '"loss":[0-9.eE+-]+' "$run/dpo/metrics.jsonl" | cut -d: -f2)
if ! awk -v l="$first_loss" 'BEGIN { d = l - log(2); exit !(d < 1e-5 && d > -1e-5) }'; then
    echo "error: the DPO run's first loss on wgpu is $first_loss, not log 2" >&2
    exit 1
fi
echo "DPO on the device: first loss $first_loss (log 2)"

# Generation's KV cache takes each decoded token's keys and values into its buffers in place:
# one slice write each per layer, counted by cubecl's own profiler (a line per kernel run; a
# `cat` of the whole cache took two each). The prompt's pass cancels in the difference between
# 6 and 2 new tokens.
slice_writes() { # new tokens → slice-assign launches in the whole run
    rm -f "$run/profile-$1.log" # cubecl appends to its log
    CUBECL_DEBUG_LOG="$run/profile-$1.log" CUBECL_DEBUG_OPTION=profile "$napkin" generate \
        "${tiny[@]}" --adapter "$run/out" --prompt "Compute 3 + 63." --max-new-tokens "$1" \
        --temperature 1 --seed 3 --device wgpu > /dev/null
    grep -cE '^\|.*SliceAssignKernel' "$run/profile-$1.log"
}
layers=$(grep -oE '"num_hidden_layers": *[0-9]+' "$fixtures/tiny-smol/config.json" | grep -oE '[0-9]+$')
per_token=$(( ($(slice_writes 6) - $(slice_writes 2)) / 4 ))
if [ "$per_token" -ne $((2 * layers)) ]; then
    echo "error: $per_token KV cache writes a decoded token; expected $((2 * layers)) (K and V once per layer)" >&2
    exit 1
fi
echo "KV cache: $per_token slice writes a decoded token ($layers layers, K and V once each)"

# A training step's launches, counted by cubecl's profiler (a line per kernel run): the
# difference between 4 and 2 steps of `measure` (tiny-smol LoRA r 8 on every projection, T = 64;
# the count does not depend on T). 1,091 on burn's ops alone; 705 with napkin's fused RMSNorm,
# RoPE and SwiGLU (kernels/gpu/fused/); 649 with each weight's gradient formed in its own
# layout (model/matmul_wt.rs: no copy to flatten it); 573 with the eager attention's scale, mask
# and softmax fused (cube_fused/softmax.rs); 531 with AdamW four parameters a launch
# (kernels/gpu/adamw.rs); 506 with the loss fused (cube_fused/cross_entropy.rs); 478 with a LoRA
# linear's scaled sum fused (cube_fused/scaled_add.rs); 450 with RoPE writing the heads'
# layout itself (cube_fused/rope.rs: 28 copies left of 56). A change that adds launches fails
# here.
step_launch_limit=450
launches_in() { # name, command... → kernel runs in the whole command (cubecl's profiler)
    local log="$run/$1.log"
    shift
    rm -f "$log"
    CUBECL_DEBUG_LOG="$log" CUBECL_DEBUG_OPTION=profile "$@" > /dev/null 2>&1
    grep -cE '^\| [0-9.]+(ns|µs|ms|s) +\| ' "$log"
}
# Op by op (`--no-capture`): cubecl's profiler logs nothing once a graph is recorded, so a
# replayed step would count as none; fewer than 100 means the count read no step.
measure_launches() { # steps → kernel runs in the whole measure run
    launches_in "step-$1" "$napkin" measure --preset tiny-smol --device wgpu --lora-r 8 \
        --seq-len 64 --steps "$1" --no-capture
}
per_step=$(( ($(measure_launches 4) - $(measure_launches 2)) / 2 ))
if [ "$per_step" -lt 100 ]; then
    echo "error: a tiny-smol LoRA step counted $per_step launches: the profiler saw no step" >&2
    exit 1
fi
if [ "$per_step" -gt "$step_launch_limit" ]; then
    echo "error: a tiny-smol LoRA step launches $per_step kernels; at most $step_launch_limit expected" >&2
    exit 1
fi
echo "training step: $per_step launches (tiny-smol LoRA, at most $step_launch_limit)"

# The same count for `napkin train` op by op (`--no-capture`: the launches a captured step's
# graph holds; cubecl's profiler stops logging once a graph is recorded), which also takes the
# gradients' global norm and clips (what `measure` does not): 674 launches a step when the norm
# was a square, a sum and a read per tensor and clipping a product per tensor; 462 with the norm
# six tensors a launch (kernels/gpu/sum_of_squares.rs, one read) and the clipping factor inside
# AdamW's update. The captured step itself is checked against op by op in tests/tests/gpu.
train_launch_limit=462
train_launches_in() { # steps → kernel runs in the whole train run
    rm -rf "$run/train-$1"
    launches_in "train-$1" "$napkin" train "${tiny[@]}" --chat-format chatml \
        --data data/napkin-instruct.jsonl --out "$run/train-$1" --device wgpu --lora-r 8 \
        --lr 3e-3 --seq-len 64 --steps "$1" --plain --no-capture
}
per_train_step=$(( ($(train_launches_in 4) - $(train_launches_in 2)) / 2 ))
if [ "$per_train_step" -lt 100 ]; then
    echo "error: a tiny-smol LoRA step of napkin train counted $per_train_step launches: the profiler saw no step" >&2
    exit 1
fi
if [ "$per_train_step" -gt "$train_launch_limit" ]; then
    echo "error: a tiny-smol LoRA step of napkin train launches $per_train_step kernels; at most $train_launch_limit expected" >&2
    exit 1
fi
echo "napkin train step: $per_train_step launches (tiny-smol LoRA, clipped, at most $train_launch_limit)"

# The GPU benchmark's smoke case (scripts/bench/gpu.sh runs the full one on a real GPU).
"$napkin" bench gpu --device wgpu --smoke --runs 3
