#!/usr/bin/env bash
# The timelines of docs/schedules.md: the ConvNet on Fashion-MNIST over 4 stage
# servers with 8 micro-batches per step, one run per schedule, each drawn from
# its last step. Writes docs/images/timeline-*.{json,png} and prints a table of
# measured idle fractions and peak activation memory.
#   bench/timelines.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/bin
out=docs/images
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '| schedule | measured idle per stage | theoretical bubble | peak activations held per stage (micro-batches) | peak activation memory per stage |\n'
printf '| --- | --- | --- | --- | --- |\n'
for schedule in gpipe 1f1b interleaved zero-bubble; do
  job="$tmp/$schedule.yaml"
  sed -e "s/^schedule: .*/schedule: $schedule/" -e 's/^epochs: 3/steps: 100/' -e 's/^eval: true/eval: false/' \
      examples/fashion-convnet.yaml > "$job"
  [ "$schedule" = interleaved ] && echo "virtual_stages: 2" >> "$job"
  "$bin/conveyor" local "$job" --json --trace "$out/timeline-$schedule" > "$tmp/$schedule.json" 2> "$tmp/$schedule.log"
  /usr/bin/python3 - "$tmp/$schedule.json" "$out/timeline-$schedule.json" "$schedule" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
trace = json.load(open(sys.argv[2]))["metadata"]
idle = " / ".join("%.0f%%" % (100 * x) for x in trace["idle_fraction"])
peak = " / ".join(str(s["peak_activations"]) for s in run["stages"])
mem = " / ".join("%.1f KiB" % (s["peak_activation_bytes"] / 1024) for s in run["stages"])
print("| %s | %s | %.0f%% | %s | %s |" % (sys.argv[3], idle, 100 * run["theoretical_idle_fraction"], peak, mem))
PY
done
