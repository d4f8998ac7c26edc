#!/usr/bin/env bash
# What failed in the last ctest run of a build folder, short enough to be read
# at the end of a long log (CI keeps a log's head and tail):
#   scripts/failures.sh BUILD_DIR
# For each failed test: its GoogleTest failures (the "file:line: Failure"
# line and its message, up to 10 lines), sanitizer reports' first lines and
# summaries, or, for a test that printed none of these (a script, a timeout),
# the last lines of its output. Everything is in BUILD_DIR/Testing/Temporary/LastTest.log.
set -euo pipefail
dir=${1:?usage: scripts/failures.sh BUILD_DIR}/Testing/Temporary
[ -s "$dir/LastTestsFailed.log" ] || exit 0
echo "=== what failed (from $dir/LastTest.log) ==="
awk -v failed_list="$dir/LastTestsFailed.log" '
  BEGIN {
    while ((getline line < failed_list) > 0) { sub(/^[0-9]+:/, "", line); failed[line] = 1 }
  }
  # One test block: "N/M Test: NAME", its output between "Output:" and "<end of output>".
  /^[0-9]+\/[0-9]+ Test: / { name = $0; sub(/^[0-9]+\/[0-9]+ Test: /, "", name); n = 0; inside = 0; next }
  /^Output:$/ { inside = 1; getline; next }
  /^<end of output>$/ { inside = 0; if (name in failed) report(); next }
  inside { out[++n] = $0 }
  function report(   i, shown, left) {
    print "--- " name
    shown = 0; left = 0
    for (i = 1; i <= n; ++i) {
      if (out[i] ~ /: Failure$/ || out[i] ~ /ERROR: (Address|Thread|Undefined|Leak)Sanitizer/ ||
          out[i] ~ /runtime error:/) left = 10
      if (out[i] ~ /^\[  FAILED  \]/ || out[i] ~ /^SUMMARY: /) { print out[i]; shown = 1; continue }
      # The message of a failure ends at the next test marker or log line.
      if (out[i] ~ /^\[/ || out[i] ~ /^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] /) left = 0
      if (left > 0) { print out[i]; --left; shown = 1 }
    }
    if (!shown) for (i = (n > 20 ? n - 19 : 1); i <= n; ++i) print out[i]
  }
' "$dir/LastTest.log"
