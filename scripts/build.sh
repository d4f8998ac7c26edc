#!/usr/bin/env bash
# Configures and builds Conveyor into ./build (BUILD_DIR overrides).
#   scripts/build.sh             everything: the programs, the test suites, the benchmarks
#   scripts/build.sh programs    the three programs only (conveyor, with conveyor-torch, which runs
#                                its LibTorch commands; stage_server, coordinator): the Quick
#                                start's, without GoogleTest or the test suites
#   scripts/build.sh --sanitize asan|tsan [TARGET...]
#                                instrumented (asan: AddressSanitizer and UndefinedBehaviorSanitizer,
#                                tsan: ThreadSanitizer) into ./build-asan or ./build-tsan, with the
#                                tests; only TARGETs if named (scripts/sanitize.sh, docs/testing.md)
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=
if [ "${1:-}" = --sanitize ]; then
  sanitize=${2:?--sanitize asan or tsan}
  shift 2
fi
build=${BUILD_DIR:-build${sanitize:+-$sanitize}}
args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release)
targets=()
if [ -n "$sanitize" ]; then
  # -O1 with line tables: reports name files and lines, and the instrumented
  # tests run at a useful speed; assertions stay on.
  args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1"
        -DCONVEYOR_SANITIZE="$sanitize" -DCONVEYOR_BUILD_TESTS=ON)
  [ $# -gt 0 ] && targets=(--target "$@")
elif [ "${1:-}" = programs ]; then
  targets=(--target conveyor conveyor-torch stage_server coordinator)
  # A build folder that already has the tests keeps them (the test suite's own build).
  grep -qs '^CONVEYOR_BUILD_TESTS:BOOL=ON' "$build/CMakeCache.txt" || args+=(-DCONVEYOR_BUILD_TESTS=OFF)
else
  args+=(-DCONVEYOR_BUILD_TESTS=ON)
fi
if [ "$(scripts/torch-source.sh)" = pip ]; then
  args+=("-DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')")
fi
cmake "${args[@]}" ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"$(nproc)" "${targets[@]}"
