#!/usr/bin/env bash
# A long job in flat memory (docs/operations.md, "A week-long job").
#
#   bench/soak.sh [OUT_DIR]
#
# Runs one toy job of STEPS (200000) steps on two CPU stage servers and a
# coordinator, every server with Prometheus metrics on (scraped at each sample),
# a watcher attached (`conveyor status --wait`), checkpoint_every: 1000, and
# stage 1 killed with SIGKILL at KILL_AT_STEP (STEPS/2) and started again at the
# same address. Every SAMPLE_S (5) seconds it writes to OUT_DIR/soak.csv: the
# step, the resident memory (VmRSS) and CPU seconds of the coordinator, of each
# stage server and of the watcher, and the job database's size (conveyor.db and
# its write-ahead log). Then bench/soak_plot.py draws OUT_DIR/soak.png and prints
# the figures. Exits 0 when the job succeeded.
#
# Settings (environment): BIN (build/bin), STEPS, KILL_AT_STEP, SAMPLE_S;
# SOAK_WARMUP_STEPS (10000) for bench/soak_plot.py's fits.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}
STEPS=${STEPS:-200000}
KILL_AT_STEP=${KILL_AT_STEP:-$((STEPS / 2))}
SAMPLE_S=${SAMPLE_S:-5}
OUT=${1:-bench/results/soak}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUN=$(mktemp -d /tmp/conveyor-soak.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$RUN"
}
trap cleanup EXIT

# Starts a server in the background; its pid in $started, its address in $RUN/NAME.addr.
start_server() {
  local name=$1; shift
  rm -f "$RUN/$name.addr" "$RUN/$name.metrics"
  "$@" --port-file "$RUN/$name.addr" --metrics-listen 127.0.0.1:0 --metrics-port-file "$RUN/$name.metrics" \
    >> "$RUN/$name.log" 2>&1 &
  started=$!
  pids+=("$started")
  for _ in $(seq 600); do [ -s "$RUN/$name.addr" ] && return 0; sleep 0.1; done
  echo "soak: $name did not start; its log:" >&2; cat "$RUN/$name.log" >&2; exit 1
}

start_stage() {  # index [address]
  mkdir -p "$RUN/stage-$1"
  start_server "stage$1" "$BIN/stage_server" --listen "${2:-127.0.0.1:0}" --device cpu --threads 1 \
    --checkpoint-dir "$RUN/stage-$1"
  stage_pid[$1]=$started
}
declare -a stage_pid
start_stage 0
start_stage 1
start_server coordinator "$BIN/coordinator" --listen 127.0.0.1:0 --state-dir "$RUN/state" \
  --stages "$(cat "$RUN/stage0.addr"),$(cat "$RUN/stage1.addr")"
coordinator_pid=$started
C="$BIN/conveyor --coordinator $(cat "$RUN/coordinator.addr")"

cat > "$RUN/job.yaml" <<EOF
# The toy model (Linear(10,10), ReLU, Linear(10,5)) over two stages: a step
# takes about a millisecond of compute, so the run is mostly the system's own.
name: soak
model: {name: toy}
partition: {stages: 2}
data: {name: synthetic, train_samples: 40000, test_samples: 0}
batch_size: 8
micro_batches: 2
schedule: 1f1b
optimizer: {name: sgd, lr: 0.01, momentum: 0.9}
loss: mse
steps: $STEPS
checkpoint_every: 1000
seed: 1
EOF
job=$($C submit "$RUN/job.yaml")
echo "soak: $job, $STEPS steps; the run's folder is $RUN"
$C status "$job" --wait --json > "$RUN/watch.json" 2> "$RUN/watch.err" &
watcher=$!
pids+=("$watcher")

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo ""; }
# The anonymous part of it (heap, stacks): VmRSS also counts the pages of the
# libraries' files, shared with other processes, read in as code runs.
anon_kb() { awk '/^RssAnon:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo ""; }
cpu_s() {  # utime + stime, in seconds
  awk -v hz="$(getconf CLK_TCK)" '{sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / hz}' "/proc/$1/stat" 2>/dev/null || echo ""
}
steps_total() {  # the coordinator's conveyor_steps_total, as Prometheus would scrape it
  curl -sf "http://$(cat "$RUN/coordinator.metrics")/metrics" | awk '/^conveyor_steps_total/ {print $2}' | tail -1
}
db_bytes() { cat "$RUN"/state/conveyor.db* 2>/dev/null | wc -c; }

csv="$OUT/soak.csv"
echo "seconds,step,coordinator_rss_kb,stage0_rss_kb,stage1_rss_kb,watcher_rss_kb,db_bytes,coordinator_cpu_s,stage0_cpu_s,stage1_cpu_s,coordinator_anon_kb,stage0_anon_kb,stage1_anon_kb,event" > "$csv"
start=$(date +%s.%N)
killed=0
while kill -0 "$watcher" 2>/dev/null; do
  step=$(steps_total || true)
  # Every stage server is scraped too (its series come from its own process).
  for s in 0 1; do curl -sf "http://$(cat "$RUN/stage$s.metrics")/metrics" > /dev/null || true; done
  event=""
  if [ "$killed" = 0 ] && [ -n "$step" ] && [ "${step%.*}" -ge "$KILL_AT_STEP" ]; then
    addr=$(cat "$RUN/stage1.addr")
    kill -KILL "${stage_pid[1]}"
    wait "${stage_pid[1]}" 2>/dev/null || true
    start_stage 1 "$addr"
    killed=1
    event="stage 1 killed (SIGKILL) and started again"
    echo "soak: $event at step $step"
  fi
  now=$(date +%s.%N)
  printf '%.1f,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' "$(awk -v a="$now" -v b="$start" 'BEGIN {print a - b}')" \
    "${step%.*}" "$(rss_kb "$coordinator_pid")" "$(rss_kb "${stage_pid[0]}")" "$(rss_kb "${stage_pid[1]}")" \
    "$(rss_kb "$watcher")" "$(db_bytes)" "$(cpu_s "$coordinator_pid")" "$(cpu_s "${stage_pid[0]}")" \
    "$(cpu_s "${stage_pid[1]}")" "$(anon_kb "$coordinator_pid")" "$(anon_kb "${stage_pid[0]}")" \
    "$(anon_kb "${stage_pid[1]}")" "$event" >> "$csv"
  sleep "$SAMPLE_S"
done
rc=0
wait "$watcher" || rc=$?
echo "soak: the watcher exited $rc"
$C status "$job" --json > "$OUT/status.json" || true
$C list > "$OUT/list.txt" || true
cp "$RUN"/*.log "$RUN/watch.err" "$OUT/" 2>/dev/null || true
# Debian's python3 has matplotlib (scripts/setup.sh); another one first
# on PATH (a pyenv's) may not.
py=python3
/usr/bin/python3 -c "import matplotlib" 2>/dev/null && py=/usr/bin/python3
"$py" bench/soak_plot.py "$csv" "$OUT/soak.png" | tee "$OUT/summary.txt"
exit "$rc"
