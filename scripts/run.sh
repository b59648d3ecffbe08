#!/usr/bin/env bash
# The main job: builds the napkin CLI (release) after the system set-up and runs it.
# Usage: scripts/run.sh <napkin arguments>, e.g. scripts/run.sh inspect --model DIR
# Paths in the arguments are relative to where you run it from.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup-system.sh"
exec cargo run --quiet --release --manifest-path "$root/Cargo.toml" -p napkin -- "$@"
