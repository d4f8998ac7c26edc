#!/usr/bin/env bash
# One GoogleTest suite as one ctest test (cmake/TestSuites.cmake):
#   run_suite.sh BIN FILTER
# runs BIN --gtest_filter=FILTER, its output as it comes, and exits with its
# status, or 77 (ctest: skipped) where it passed with no test passing: every
# test of the suite skipped (a GPU suite on a machine without one). A failure
# is never a skip.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$1" "--gtest_filter=$2" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ] && grep -q '^\[  PASSED  \] 0 tests' "$log"; then
  exit 77
fi
exit "$rc"
