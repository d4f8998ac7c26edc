#!/usr/bin/env bash
# A coordinator and its stage servers under load (docs/operations.md, "Under load").
#
#   bench/load/load.sh [OUT_DIR]
#
# On two CPU stage servers and one coordinator (metrics on), in three parts:
#  1. abuse: a 2-stage toy job runs while ABUSE_CLIENTS clients send each stage
#     server garbage bytes, malformed frames and oversized StageControl calls
#     (load_bench abuse); the job must still be running when the abuse ends,
#     and succeed.
#  2. load: JOBS one-stage toy jobs submitted by CLIENTS clients at once,
#     WATCHERS watchers, GetJob and ListJobs at RATE a second, for SECONDS
#     (load_bench load): no error at all, each call's p50 and p99.
#  3. kill: the same load again; KILL_AFTER seconds in, the coordinator gets
#     SIGKILL and is started again on its state folder at its address; then every
#     job any client was told was submitted must be in the database with a valid
#     state (load_bench check), `conveyor list` must work, and SQLite's
#     integrity_check must say ok.
# Writes OUT_DIR/load.txt (everything printed). Settings (environment): BIN
# (build/bin), JOBS (1000), CLIENTS (20), WATCHERS (100), RATE (200), LOAD_SECONDS
# (60), KILL_AFTER (10), ABUSE_CLIENTS (16), ABUSE_SECONDS (30), ABUSED_STEPS (20000:
# enough that the job outlasts the abuse).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
JOBS=${JOBS:-1000} CLIENTS=${CLIENTS:-20} WATCHERS=${WATCHERS:-100} RATE=${RATE:-200} SECONDS_=${LOAD_SECONDS:-60}
KILL_AFTER=${KILL_AFTER:-10} ABUSE_CLIENTS=${ABUSE_CLIENTS:-16} ABUSE_SECONDS=${ABUSE_SECONDS:-30}
ABUSED_STEPS=${ABUSED_STEPS:-20000}
OUT=${1:-bench/results/load}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUN=$(mktemp -d /tmp/conveyor-load.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$RUN"
}
trap cleanup EXIT
exec > >(tee "$OUT/load.txt") 2>&1

start_server() {  # NAME COMMAND...: pid in $started, address in $RUN/NAME.addr
  local name=$1; shift
  rm -f "$RUN/$name.addr"
  "$@" --port-file "$RUN/$name.addr" --metrics-listen 127.0.0.1:0 >> "$RUN/$name.log" 2>&1 &
  started=$!
  pids+=("$started")
  for _ in $(seq 600); do [ -s "$RUN/$name.addr" ] && return 0; sleep 0.1; done
  echo "load: $name did not start; its log:"; cat "$RUN/$name.log"; exit 1
}
for s in 0 1; do
  mkdir -p "$RUN/stage-$s"
  start_server "stage$s" "$BIN/stage_server" --listen 127.0.0.1:0 --device cpu --threads 1 \
    --checkpoint-dir "$RUN/stage-$s" --log-level warn
done
STAGES="$(cat "$RUN/stage0.addr"),$(cat "$RUN/stage1.addr")"
start_coordinator() {  # [ADDRESS]
  start_server coordinator "$BIN/coordinator" --listen "${1:-127.0.0.1:0}" --state-dir "$RUN/state" \
    --stages "$STAGES" --log-level warn
  coordinator_pid=$started
}
start_coordinator
ADDR=$(cat "$RUN/coordinator.addr")
C="$BIN/conveyor --coordinator $ADDR"
echo "load: $(date -u +%FT%TZ) on $(nproc) cores; stages $STAGES, coordinator $ADDR"

echo "== 1. abuse: malformed and oversized RPCs to both stage servers while a job runs"
cat > "$RUN/abused.yaml" <<EOF
name: abused
model: {name: toy}
partition: {stages: 2}
data: {name: synthetic, train_samples: 4096, test_samples: 256}
batch_size: 16
micro_batches: 2
optimizer: {name: sgd, lr: 0.01}
loss: mse
steps: $ABUSED_STEPS
eval: true
seed: 1
EOF
field() {  # JOB KEY: one field of `conveyor status --json`
  $C status "$1" --json | python3 -c "import json, sys; print(json.load(sys.stdin)['$2'])"
}
job=$($C submit "$RUN/abused.yaml")
until [ "$(field "$job" state)" = running ]; do sleep 0.2; done
abuse_rc=0
abusers=()
for s in 0 1; do
  "$BIN/load_bench" abuse --stage "$(cat "$RUN/stage$s.addr")" --clients "$ABUSE_CLIENTS" \
    --seconds "$ABUSE_SECONDS" > "$RUN/abuse$s.txt" 2>&1 &
  abusers+=($!)
  pids+=($!)
done
for p in "${abusers[@]}"; do wait "$p" || abuse_rc=1; done
cat "$RUN/abuse0.txt" "$RUN/abuse1.txt"
state=$(field "$job" state)
echo "load: when the abuse ended the job was $state at step $(field "$job" steps) of $ABUSED_STEPS"
[ "$state" = running ] || abuse_rc=1
$C status "$job" --wait > "$RUN/abused.txt" 2>&1 || abuse_rc=1
echo "load: the abused job ended $(field "$job" state), param_digest $(field "$job" param_digest)"

cat > "$RUN/tiny.yaml" <<EOF
name: tiny
model: {name: toy}
partition: {stages: 1}
data: {name: synthetic, train_samples: 64, test_samples: 0}
batch_size: 8
optimizer: {name: sgd, lr: 0.01}
loss: mse
steps: 20
seed: 1
EOF
echo "== 2. load: $JOBS jobs by $CLIENTS clients, $WATCHERS watchers, GetJob and ListJobs at $RATE/s for $SECONDS_ s"
load_rc=0
"$BIN/load_bench" load --coordinator "$ADDR" --job "$RUN/tiny.yaml" --jobs "$JOBS" --clients "$CLIENTS" \
  --watchers "$WATCHERS" --rate "$RATE" --seconds "$SECONDS_" --ids-out "$RUN/ids.txt" || load_rc=$?
ps -o rss=,cputime= -p "$coordinator_pid" | awk '{print "load: the coordinator'\''s RSS " $1 / 1024 " MiB, CPU time " $2}'

echo "== 3. kill: the same load; the coordinator killed (SIGKILL) after $KILL_AFTER s and started again"
"$BIN/load_bench" load --coordinator "$ADDR" --job "$RUN/tiny.yaml" --jobs "$JOBS" --clients "$CLIENTS" \
  --watchers "$WATCHERS" --rate "$RATE" --seconds "$SECONDS_" --ids-out "$RUN/ids.txt" \
  --allow UNAVAILABLE > "$RUN/kill.txt" 2>&1 &
loader=$!
pids+=("$loader")
sleep "$KILL_AFTER"
kill -KILL "$coordinator_pid"
wait "$coordinator_pid" 2>/dev/null || true
echo "load: killed the coordinator at $(date -u +%T); $(wc -l < "$RUN/ids.txt") jobs acknowledged so far"
start_coordinator "$ADDR"
echo "load: the coordinator serves again at $(date -u +%T)"
kill_rc=0
wait "$loader" || kill_rc=$?
cat "$RUN/kill.txt"
check_rc=0
"$BIN/load_bench" check --coordinator "$ADDR" --ids "$RUN/ids.txt" || check_rc=$?
list_rc=0
$C list > "$RUN/list.txt" || list_rc=$?
echo "load: conveyor list exited $list_rc with $(wc -l < "$RUN/list.txt") lines"
if command -v sqlite3 > /dev/null; then
  echo "load: integrity_check: $(sqlite3 "file:$RUN/state/conveyor.db?mode=ro" 'PRAGMA integrity_check;')"
fi
echo "load: abuse $abuse_rc, load $load_rc, kill $kill_rc, check $check_rc, list $list_rc"
[ "$abuse_rc$load_rc$kill_rc$check_rc$list_rc" = 00000 ]
