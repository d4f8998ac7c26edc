#!/usr/bin/env bash
# Conveyor's GPU tests, after bench/gpu/build.sh. About 5 minutes for both default parts.
#
#   bench/gpu/tests.sh            the default: gpu and nccl
#   bench/gpu/tests.sh gpu        ctest -L gpu (recovery on an NCCL link among them)      $out/ctest-gpu.log
#   bench/gpu/tests.sh nccl       equality_test's NCCL suite (Nccl/*)                      $out/equality-nccl.log
#   bench/gpu/tests.sh replicas   the replicas' tests: NCCL collectives, replica groups, the gradient reducer,
#                                 ZeRO (2 x 2 where there are four GPUs)   $out/replicas-unit.log, replicas-gpu.log
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

part_default() { part_gpu; part_nccl; }

run_parts default "$@"
