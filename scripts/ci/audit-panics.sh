#!/usr/bin/env bash
# Lists every place in napkin-core's parsers of user files (io/, data/, config/, tokenizer,
# chat templates, the answer checker) where clippy sees a possible panic: unwrap, expect,
# panic!, and indexing or slicing. docs/reliability.md says why each remaining kind is safe.
# Usage: scripts/ci/audit-panics.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo clippy --quiet -p napkin-core --no-deps --message-format short -- \
    -A clippy::all -W clippy::unwrap_used -W clippy::expect_used -W clippy::panic \
    -W clippy::indexing_slicing 2>&1 |
    grep -E '^core/src/(io|data|config|tokenizer|chat|exercises/answer)' | sort -u |
    tee /dev/stderr | awk -F': warning: ' '{ print $2 }' | sort | uniq -c
