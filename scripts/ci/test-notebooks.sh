#!/usr/bin/env bash
# Runs every course notebook as a student's Jupyter runs it: the evcxr Jupyter kernel
# (evcxr_jupyter from crates.io, pinned, installed when missing) executing the cells in order
# through `jupyter nbconvert --execute` (Python tools in .venv-notebooks, pinned), from a fresh
# kernel per notebook. Fails on a cell error, naming the notebook, the cell and the error.
# Not part of scripts/test.sh: evcxr builds napkin-core again in its own target folder (see the
# README's course section for the times); tests/notebooks.rs is the fast compile check CI runs.
# Usage: scripts/ci/test-notebooks.sh [notebook.ipynb ...]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
evcxr_version=0.22.0
if ! cargo install --list | grep -q "^evcxr_jupyter v$evcxr_version:"; then
    echo "installing evcxr_jupyter $evcxr_version (one time; it builds rust-analyzer's crates)..."
    cargo install --quiet --locked evcxr_jupyter --version "$evcxr_version"
fi
venv="$root/.venv-notebooks"
if ! "$venv/bin/jupyter" nbconvert --version >/dev/null 2>&1; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet nbconvert==7.17.2 nbclient==0.11.0 jupyter-client==8.10.0
fi
# Registers the "rust" kernel in the user's Jupyter folder, as a student's set-up does.
evcxr_jupyter --install >/dev/null
# One evcxr build folder for all notebooks, so napkin-core is built once: outside the
# repository (inside it, cargo takes evcxr's crate for a stray workspace member) and in the
# temporary folder (under ~/.cache, evcxr 0.22's load of the first cell's shared library failed
# here with "dlopen failed", not diagnosed further; /tmp works).
export EVCXR_TMPDIR="${EVCXR_TMPDIR:-${TMPDIR:-/tmp}/napkin-evcxr}"
mkdir -p "$EVCXR_TMPDIR"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
notebooks=("$@")
[ ${#notebooks[@]} -gt 0 ] || notebooks=(notebooks/*.ipynb)
# The first cell whose output is an error: its number among the code cells, and the error.
first_error='
import json, sys
nb = json.load(open(sys.argv[1]))
code = [c for c in nb["cells"] if c["cell_type"] == "code"]
for i, cell in enumerate(code, 1):
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            lines = "".join(cell["source"]).strip().splitlines() or [""]
            print(f"code cell {i} of {len(code)} (it begins: {lines[0]!r})")
            print("\n".join(out.get("traceback") or [out.get("ename", ""), out.get("evalue", "")]))
            sys.exit(1)
print(len(code))
'
for nb in "${notebooks[@]}"; do
    start=$(date +%s)
    # --allow-errors: the run goes on so the executed notebook names the failing cell.
    if ! "$venv/bin/jupyter" nbconvert --to notebook --execute --allow-errors \
        --ExecutePreprocessor.kernel_name=rust --ExecutePreprocessor.timeout=3600 \
        --output-dir "$out" "$nb" > "$out/log" 2>&1; then
        echo "FAILED: $nb: the kernel did not run it" >&2
        tail -n 20 "$out/log" >&2
        exit 1
    fi
    if ! report=$(python3 -c "$first_error" "$out/$(basename "$nb")"); then
        echo "FAILED: $nb, $report" | sed 's/\x1b\[[0-9;]*m//g' >&2
        exit 1
    fi
    echo "ok: $nb ($report code cells, $(( $(date +%s) - start )) s)"
done
