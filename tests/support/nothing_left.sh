#!/usr/bin/env bash
# ctest's cleanup check: the files that tests left in ctest's working folder
# (FOLDER, where a test's relative paths land: build/tests), newer than the
# run's start (STAMP, touched by test_tmp.make). A test writes under its own
# temporary folder instead (docs/testing.md, "Nothing left behind").
#   nothing_left.sh FOLDER STAMP
set -euo pipefail
left=$(find "$1" -maxdepth 1 -type f -newer "$2" ! -name '*.cmake' | sort)
[ -z "$left" ] && exit 0
echo "tests left these in ctest's working folder $1:"
echo "$left"
exit 1
