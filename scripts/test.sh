#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test with ctest.
#   scripts/test.sh [CTEST_ARGS...]
#   scripts/test.sh --sanitize asan|tsan [CTEST_ARGS...]
#       the suite built with AddressSanitizer and UndefinedBehaviorSanitizer
#       (build-asan) or ThreadSanitizer (build-tsan): scripts/sanitize.sh --all
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh
if [ "${1:-}" = --sanitize ]; then
  scripts/sanitize.sh --all "${2:?--sanitize asan or tsan}" "${@:3}"
  echo "test.sh: $(( $(date +%s) - start )) s in all"
  exit 0
fi
scripts/build.sh
# A short fuzz smoke of the decoders the servers run on untrusted input
# (bench/fuzz/run.sh without an argument runs 1,000,000 executions each).
bench/fuzz/run.sh "${FUZZ_RUNS:-20000}"
# A failure's lines are repeated at the end (scripts/failures.sh): a long
# log's middle, where ctest printed them, is what gets cut.
ctest --test-dir "${BUILD_DIR:-build}" -j"$(nproc)" --output-on-failure --timeout 900 "$@" ||
  { rc=$?; scripts/failures.sh "${BUILD_DIR:-build}"; exit "$rc"; }
echo "test.sh: $(( $(date +%s) - start )) s in all"
