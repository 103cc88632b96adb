#!/usr/bin/env bash
# Configures and builds zerod into ./build (Release, Ninja when present). Extra arguments go to
# the CMake configure step, e.g. tools/build.sh -DZEROD_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
if command -v ninja >/dev/null 2>&1 && [[ ! -f build/CMakeCache.txt ]]; then generator=(-G Ninja); fi
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"
