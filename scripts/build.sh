#!/usr/bin/env bash
# Configures and builds Conveyor into ./build (BUILD_DIR overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release)
if [ "$(scripts/torch-source.sh)" = pip ]; then
  args+=("-DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')")
fi
cmake "${args[@]}" ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"$(nproc)"
