#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test with ctest.
#   scripts/test.sh [CTEST_ARGS...]
#   scripts/test.sh --sanitize asan|tsan [CTEST_ARGS...]
#       the suite built with AddressSanitizer and UndefinedBehaviorSanitizer
#       (build-asan) or ThreadSanitizer (build-tsan): scripts/sanitize.sh --all
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
phases=()
# Notes the time since the last phase ended; the summary line names each.
phase() { local now; now=$(date +%s); phases+=("$1 $(( now - ${last:-$start} )) s"); last=$now; }
# The wall time of each phase and the CPU seconds of all (bash's `times`:
# its children's user and system time), at the end of a run that passed or failed.
summary() {
  local times_file cpu
  times_file=$(mktemp)
  times > "$times_file"  # in this shell: in a pipe it would count the pipe's subshell
  cpu=$(tail -1 "$times_file" | awk '{print $1 " user, " $2 " system"}')
  rm -f "$times_file"
  echo "test.sh: $(IFS=,; echo "${phases[*]}" | sed 's/,/, /g'); $(( $(date +%s) - start )) s in all, CPU $cpu"
}
trap summary EXIT
scripts/setup.sh
phase setup
if [ "${1:-}" = --sanitize ]; then
  scripts/sanitize.sh --all "${2:?--sanitize asan or tsan}" "${@:3}"
  phase "sanitize.sh $2"
  exit 0
fi
scripts/build.sh
phase build
# A short fuzz smoke of the decoders the servers run on untrusted input
# (bench/fuzz/run.sh without an argument runs 1,000,000 executions each).
bench/fuzz/run.sh "${FUZZ_RUNS:-20000}"
phase fuzz
# A failure's lines are repeated at the end (scripts/failures.sh): a long
# log's middle, where ctest printed them, is what gets cut.
ctest --test-dir "${BUILD_DIR:-build}" -j"$(nproc)" --output-on-failure --timeout 900 "$@" ||
  { rc=$?; phase ctest; scripts/failures.sh "${BUILD_DIR:-build}"; exit "$rc"; }
phase ctest
