#!/usr/bin/env bash
# Conveyor's GPU tests, after bench/gpu/build.sh. About 5 minutes for both default parts.
#
#   bench/gpu/tests.sh            the default: gpu and nccl
#   bench/gpu/tests.sh gpu        ctest -L gpu (recovery on an NCCL link among them)      $out/ctest-gpu.log
#   bench/gpu/tests.sh nccl       equality_test's NCCL suite (Nccl/*)                      $out/equality-nccl.log
#   bench/gpu/tests.sh replicas   the replicas' tests: NCCL collectives, replica groups, the gradient reducer,
#                                 ZeRO (2 x 2 where there are four GPUs)   $out/replicas-unit.log, replicas-gpu.log
#   bench/gpu/tests.sh asan       builds the GPU tests with ASan+UBSan (build-asan, BUILD_DIR's sibling) and runs
#                                 gpu_test and the NCCL equality cases under it; compute-sanitizer's memcheck over
#                                 one GPU test where the machine has it      $out/asan-build.log, asan-gpu.log, ...
# Each part prints one line: the tests that passed, failed or were skipped; any failed test is named.
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"

part_gpu() {
  timeout 300 ctest --test-dir "$build" -L gpu --timeout 200 --output-on-failure > "$out/ctest-gpu.log" 2>&1
  echo "ctest -L gpu: exit $? ($(grep -E 'tests passed|tests failed' "$out/ctest-gpu.log" | tail -1))"
  grep -E '^\s*[0-9]+ - .*(Failed|Timeout|Not Run)' "$out/ctest-gpu.log"
}

part_nccl() {
  timeout 120 "$bin/equality_test" --gtest_filter='Nccl/*' > "$out/equality-nccl.log" 2>&1
  echo "equality Nccl/*: $(grep -E 'PASSED|FAILED' "$out/equality-nccl.log" | head -2 | tr '\n' ' ')"
}

part_replicas() {
  timeout 150 "$bin/stage_server_test" --gtest_filter='*Nccl*:ReplicaGroup.*:GradientReducer.*' \
    > "$out/replicas-unit.log" 2>&1
  echo "stage_server_test replicas: $(gtest_verdict "$out/replicas-unit.log")"
  timeout 200 "$bin/gpu_test" --gtest_filter='*Replica*:*Nccl*:*Zero*' > "$out/replicas-gpu.log" 2>&1
  echo "gpu_test replicas: $(gtest_verdict "$out/replicas-gpu.log")"
}

# CUDA maps its memory where ASan's shadow gap is: protect_shadow_gap=0 lets the
# two share the address space (docs/testing.md, "Sanitizers").
part_asan() {
  local asan=${build}-asan
  local gloo=()
  [ -d .gpu/gloo-include ] && gloo=("-DCONVEYOR_GLOO_INCLUDE_DIR=$PWD/.gpu/gloo-include")
  if ! CMAKE_ARGS="${gloo[*]}" BUILD_DIR=$asan scripts/build.sh --sanitize asan gpu_test equality_test stage_server \
      coordinator conveyor > "$out/asan-build.log" 2>&1; then
    echo "asan build failed:"; grep -E "error|FAILED" "$out/asan-build.log" | head -20
    return 1
  fi
  local supp=$PWD/tests/sanitizers
  export ASAN_OPTIONS="protect_shadow_gap=0:halt_on_error=1:detect_leaks=1:suppressions=$supp/asan.supp"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp"
  timeout 400 "$asan/bin/gpu_test" > "$out/asan-gpu.log" 2>&1
  echo "gpu_test under ASan+UBSan: exit $? ($(gtest_verdict "$out/asan-gpu.log"))"
  grep -m3 -E "ERROR: (Address|Leak)Sanitizer|runtime error" "$out/asan-gpu.log"
  timeout 150 "$asan/bin/equality_test" --gtest_filter='Nccl/*' > "$out/asan-nccl.log" 2>&1
  echo "equality Nccl/* under ASan+UBSan: exit $? ($(gtest_verdict "$out/asan-nccl.log"))"
  grep -m3 -E "ERROR: (Address|Leak)Sanitizer|runtime error" "$out/asan-nccl.log"
  # --report-api-errors no: NCCL probes for kernels built for other GPUs
  # (cudaFuncGetAttributes answers cudaErrorNoKernelImageForDevice) and goes
  # on; memcheck would count each probe as an error.
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null | head -1)
  if [ -z "$cs" ] || [ ! -x "$bin/gpu_test" ]; then
    echo "compute-sanitizer: ${cs:-not on this machine}${cs:+ found, but no $bin/gpu_test: bench/gpu/build.sh first}"
    return 0
  fi
  timeout 300 "$cs" --tool memcheck --report-api-errors no --target-processes all "$bin/gpu_test" \
    --gtest_filter='GpuTest.ConveyorLocalFoldsFourStagesOntoOneServerPerGpu' > "$out/memcheck.log" 2>&1
  echo "compute-sanitizer memcheck: exit $? ($(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | sort | uniq -c | tr '\n' ' '))"
}

part_default() { part_gpu; part_nccl; }

run_parts default "$@"
