# Sourced by scripts/test.sh (CUDA's clippy check) and scripts/bench/gpu.sh: the environment
# that burn 0.22.1's CUDA backend needs to compile and link on a machine with no network access
# to GitHub and, possibly, no NVIDIA toolkit. What it needs beyond crates, found by building it:
# - cudarc reads the CUDA version from `nvcc --version`; without nvcc, CUDARC_CUDA_VERSION names
#   one (the driver and NVRTC themselves are loaded at run time; 13000 suits driver 580+);
# - cubecl-cuda always links cubecl-llvm, whose build script downloads tracel's LLVM 23.1
#   bundle from GitHub releases into $XDG_DATA_HOME/tracel. napkin compiles its CUDA kernels
#   with NVRTC instead (cubecl-cuda's `cpp` backend, core/Cargo.toml), so LLVM is linked but
#   never called, and Debian's LLVM 22 (llvm-22-dev, libpolly-22-dev, libzstd-dev) stands in
#   for the bundle in a data directory of this checkout's own (target/llvm-stand-in);
# - the bundler turns llvm-config's `/usr/lib/…/libz3.so` into `-llibz3`: a link named
#   liblibz3.so in target/llvm-stand-in/link answers it (LIBRARY_PATH; the final binary does
#   not need libz3 at run time: nothing it uses refers to it).
# Where tracel's bundle is installed (a build with network access), it is used as is.

if ! command -v nvcc >/dev/null; then
    export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-13000}"
fi

cuda_llvm_bundle="tracel/tracel-llvm-23.1.0-4"
if [ ! -e "${XDG_DATA_HOME:-$HOME/.local/share}/$cuda_llvm_bundle/.tracel-llvm-installed" ]; then
    cuda_llvm=/usr/lib/llvm-22
    cuda_packages=()
    [ -x "$cuda_llvm/bin/llvm-config" ] || cuda_packages+=(llvm-22-dev)
    [ -e "$cuda_llvm/lib/libPolly.a" ] || cuda_packages+=(libpolly-22-dev)
    compgen -G '/usr/lib/*/libzstd.so' >/dev/null || cuda_packages+=(libzstd-dev)
    if [ "${#cuda_packages[@]}" -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            echo "installing ${cuda_packages[*]} (Debian's LLVM 22 stands in for the LLVM bundle cubecl-llvm downloads)..."
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${cuda_packages[@]}" >/dev/null
        else
            echo "error: the CUDA build needs ${cuda_packages[*]} (Debian: apt-get install" \
                "${cuda_packages[*]}) or tracel's LLVM bundle (a build with network access installs it)" >&2
            exit 1
        fi
    fi
    cuda_stand_in="$PWD/target/llvm-stand-in"
    mkdir -p "$cuda_stand_in/$cuda_llvm_bundle" "$cuda_stand_in/link"
    for dir in bin include lib; do
        ln -sfn "$cuda_llvm/$dir" "$cuda_stand_in/$cuda_llvm_bundle/$dir"
    done
    # The bundler's build script reruns when this marker changes, and everything CUDA above it
    # rebuilds (~25 minutes on two cores): make it once, never touch it again.
    marker="$cuda_stand_in/$cuda_llvm_bundle/.tracel-llvm-installed"
    [ -e "$marker" ] || touch "$marker"
    z3=$("$cuda_llvm/bin/llvm-config" --link-static --system-libs | tr ' ' '\n' | grep 'libz3\.so$' || true)
    if [ -n "$z3" ]; then
        ln -sfn "$z3" "$cuda_stand_in/link/liblibz3.so"
    fi
    export XDG_DATA_HOME="$cuda_stand_in"
    export LIBRARY_PATH="$cuda_stand_in/link${LIBRARY_PATH:+:$LIBRARY_PATH}"
fi
