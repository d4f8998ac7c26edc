#!/usr/bin/env bash
# Build Conveyor on the GPU machine against the torch wheel's LibTorch (CUDA), into build/ (BUILD_DIR),
# with gloo's headers from .gpu/gloo-include where the kit has them (the replicas need them). About
# 2 minutes on 32 cores; the other recipes use this build, so keep the folder between calls while the
# machine stays warm, or begin each call with this recipe (bench/gpu/build.sh && bench/gpu/pipeline.sh).
#
#   bench/gpu/build.sh       $out/build.log, $out/machine.txt (nvidia-smi -L); on failure its errors
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"

part_build() {
  nvidia-smi -L > "$out/machine.txt" 2>&1
  local gloo=()
  [ -d .gpu/gloo-include ] && gloo=("-DCONVEYOR_GLOO_INCLUDE_DIR=$PWD/.gpu/gloo-include")
  if ! CMAKE_ARGS="${gloo[*]}" BUILD_DIR=$build scripts/build.sh > "$out/build.log" 2>&1; then
    grep -E "error|FAILED" "$out/build.log" | head -30
    exit 1
  fi
  tail -3 "$out/build.log"
}

run_parts build "$@"
