#!/usr/bin/env bash
# One archive of the built sandbox (web/dist, with its precompressed .br/.gz files) that any
# static web server can host: unpack it into the server's folder. For the CSP and compression
# web/serve.mjs sends, configure the server likewise (README, "Serving a workshop").
# Usage: scripts/package-sandbox.sh [OUT.tar.gz]   (default napkin-sandbox.tar.gz; builds first)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-napkin-sandbox.tar.gz}")"
bash "$root/scripts/ci/web-build.sh"
tar -C "$root/web/dist" -czf "$out.part" .
mv "$out.part" "$out"
echo "$out: $(stat -c %s "$out") bytes"
