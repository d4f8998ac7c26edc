#!/usr/bin/env bash
# The project's code under the sanitizers (docs/testing.md, "Sanitizers").
#   scripts/sanitize.sh              CI's run: ASan+UBSan over the concurrency and decoding
#                                    units (transport, inbox, work queue, executor, worker pool,
#                                    job store, coordinator, frame and chunk decoders) and the
#                                    chaos tests, the .pt2 fuzz target's inputs replayed, then
#                                    ThreadSanitizer over the torch-free units;
#                                    builds only the targets these need (build-asan, build-tsan)
#   scripts/sanitize.sh asan|tsan    one of the two
#   scripts/sanitize.sh --units      the torch-free units alone (inbox, work queue, job
#                                    store, executor, worker pool, metrics and their endpoint)
#                                    under both: a quicker check
#   scripts/sanitize.sh --all asan|tsan [CTEST_ARGS...]
#                                    the whole suite so (scripts/test.sh --sanitize asan|tsan);
#                                    under tsan the whole suite is the torch-free units: LibTorch
#                                    and its OpenMP are not instrumented
set -euo pipefail
cd "$(dirname "$0")/.."
all=
units=
if [ "${1:-}" = --all ]; then all=1; shift; fi
if [ "${1:-}" = --units ]; then units=1; shift; fi
kinds=("${1:-asan}")
[ $# -eq 0 ] && kinds=(asan tsan)
shift || true
supp=$PWD/tests/sanitizers
# halt_on_error: a report fails its test; the suppressions name third-party code only.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:strict_init_order=1:check_initialization_order=1:suppressions=$supp/asan.supp${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
for kind in "${kinds[@]}"; do
  start=$(date +%s)
  build=build-$kind
  case "$kind:$all" in
    asan:1) targets=() ;;  # everything
    asan:) targets=(sanitized_units_test sanitized_transport_test sanitized_coordinator_test sanitized_chaos_test
                    metrics_test replay_exported_program stage_server coordinator conveyor)
           [ -n "$units" ] && targets=(sanitized_units_test metrics_test) ;;
    tsan:*) targets=(sanitized_units_test metrics_test) ;;
    *) echo "sanitize.sh: asan or tsan, not $kind" >&2; exit 2 ;;
  esac
  BUILD_DIR=$build nice -n 5 scripts/build.sh --sanitize "$kind" "${targets[@]}"
  built=$(( $(date +%s) - start ))
  # The torch-free units are labelled sanitize (tests/sanitizers); metrics_test
  # is the metrics registry, its HTTP endpoint, the executor and the worker pool.
  if [ -n "$all" ] && [ "$kind" = asan ]; then
    ctest_args=(-LE sanitize -E '^deploy\.(containers|images)$')  # their images lack the sanitizers' runtimes
  else
    ctest_args=(-R '^(sanitize\.|Metrics|TextEndpoint|SteadyRate|Server|SerialExecutor|WorkerPool|test_tmp\.)')
    # A gRPC server's threads synchronize inside gRPC and Abseil (Debian's, not
    # instrumented): TSan reports their internals by the dozen, so the
    # gRPC-serving test runs under ASan only.
    [ "$kind" = tsan ] && ctest_args+=(-E '^ServerHealth\.')
    [ -n "$units" ] && [ "$kind" = asan ] && ctest_args+=(-E '^sanitize\.replay_')  # --units builds no replay
  fi
  ctest --test-dir "$build" -j"$(nproc)" --output-on-failure --timeout 900 "${ctest_args[@]}" "$@" ||
    { rc=$?; scripts/failures.sh "$build"; exit "$rc"; }
  echo "sanitize.sh $kind: built in $built s, $(( $(date +%s) - start )) s in all"
done
