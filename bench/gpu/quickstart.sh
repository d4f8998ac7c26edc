#!/usr/bin/env bash
# How fast is the Quick start's job (examples/fashion-convnet.yaml, the ConvNet on Fashion-MNIST) on the
# GPUs? After bench/gpu/build.sh; the kit must carry Fashion-MNIST's package (unpacked where it is missing).
#
#   bench/gpu/quickstart.sh          the default, fold: the job (2 epochs) on two GPUs as `conveyor local` runs
#                                    it (folded into one stage server per GPU, one hardware queue) and as 4
#                                    servers (--stages 4), on four GPUs where there are four, its reference on
#                                    one GPU, folded with 8 hardware queues (CUDA's default), and the fold's GPU
#                                    test. One line a run: each epoch's seconds, steady ms per step, the last
#                                    epoch's loss, each stage's busy fraction; about 3 minutes     $out/fold.tgz
#   bench/gpu/quickstart.sh timeline the job as the Quick start runs it (3 epochs) over the GPUs, with its last
#                                    step's timeline and the loss curves: epochs, accuracy, each stage's device,
#                                    busy fraction and graphed steps                          $out/quickstart/
#   bench/gpu/quickstart.sh lost     a server lost for good: the job (1 epoch) over 4 stage servers on the GPUs
#                                    (`on_lost_server: replan`, `lost_after: 1`, a checkpoint every 100 steps),
#                                    server 2 SIGKILLed after step 250 and never started again; the events'
#                                    times from the kill, the steps redone, and the digest against the same job
#                                    run without a kill; LOG_LEVEL=info logs each phase of the recovery,
#                                    LOST_SETS='--set KEY=VALUE ...' changes both runs' job      $out/lost/
#   bench/gpu/quickstart.sh lost_replica  the same as 2 replicas of 2 stages with `commit_steps: true`: server 2
#                                    (replica 1's first stage) killed; the steps redone, and the steady ms a step
#                                    of the uninterrupted run with and without commit_steps         $out/lost_replica/
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"

part_fold() {
  local gpus runs r name vis envs extra cmd
  fashion_mnist
  mkdir -p "$out/fold"
  gpus=$(gpu_count)
  # name|GPUs|environment|arguments; `conveyor local` starts a pipeline's servers with one hardware queue
  runs=("ref|0||" "2gpu-folded|0,1||" "2gpu-folded-8queues|0,1|CUDA_DEVICE_MAX_CONNECTIONS=8|"
        "2gpu-4servers|0,1||--stages 4")
  [ "$gpus" -ge 4 ] && runs+=("4gpu-4stages|0,1,2,3||")
  for r in "${runs[@]}"; do
    IFS='|' read -r name vis envs extra <<< "$r"
    cmd=(local examples/fashion-convnet.yaml --curves '' --trace "$out/fold/$name-timeline")
    [ "$name" = ref ] && cmd=(train examples/fashion-convnet.yaml --reference --device cuda:0)
    env CUDA_VISIBLE_DEVICES=$vis $envs timeout 150 "$bin/conveyor" "${cmd[@]}" --set epochs=2 $extra --json \
      > "$out/fold/$name.json" 2> "$out/fold/$name.log"
    job_line "$out/fold/$name.json" "$name" 64
  done
  timeout 60 stdbuf -oL "$bin/gpu_test" --gtest_filter='*Fold*' > "$out/fold/gpu-test.log" 2>&1
  echo "fold's GPU test: $(gtest_verdict "$out/fold/gpu-test.log")"
  pack fold
}

part_timeline() {
  fashion_mnist
  mkdir -p "$out/quickstart"
  /usr/bin/time -f "quickstart: %e s wall" timeout 240 "$bin/conveyor" local examples/fashion-convnet.yaml --json \
    --trace "$out/quickstart/timeline" --curves "$out/quickstart/curves.png" > "$out/quickstart/qs.json" 2> "$out/quickstart/qs.log"
  tail -1 "$out/quickstart/qs.log"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('epochs', [round(e['train_seconds'],2) for e in j['epochs']], 'acc', j['eval_accuracy']); [print(' stage', s.get('index'), s.get('device'), 'busy', round(s.get('busy_fraction',0),3), 'graphed', s.get('graphed_steps')) for s in j.get('stages',[])]" \
    "$out/quickstart/qs.json" 2>&1 | tail -6
}

part_lost() {
  lost_run lost --set partition.stages=4
}

part_lost_replica() {
  lost_run lost_replica --set partition.stages=2 --set replicas=2 --set commit_steps=true
}

# lost_run NAME SETS...: the job over 4 stage servers laid out by SETS, run
# once whole and once with server 2 killed after step 250.
lost_run() {
  local name=$1 run n i pids=() job killed_ms c extra
  shift
  fashion_mnist
  mkdir -p "$out/$name"
  run=$(mktemp -d /tmp/conveyor-lost.XXXXXX)
  n=$(gpu_count)
  for i in 0 1 2 3; do
    "$bin/stage_server" --listen 127.0.0.1:0 --port-file "$run/stage$i.addr" --device "cuda:$((i % n))" \
      --checkpoint-dir "$run/stage$i" --log-level "${LOG_LEVEL:-warn}" > "$out/$name/stage$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3; do wait_file "$run/stage$i.addr" > /dev/null || return 1; done
  "$bin/coordinator" --listen 127.0.0.1:0 --port-file "$run/coordinator.addr" --state-dir "$run/state" --log-level "${LOG_LEVEL:-warn}" \
    --stages "$(for i in 0 1 2 3; do cat "$run/stage$i.addr"; echo; done | paste -sd,)" > "$out/$name/coordinator.log" 2>&1 &
  pids+=($!)
  wait_file "$run/coordinator.addr" > /dev/null || return 1
  c=("$bin/conveyor" --coordinator "$(cat "$run/coordinator.addr")")
  local sets=("$@" --set on_lost_server=replan --set lost_after=1 --set checkpoint_every=100)
  read -r -a extra <<< "${LOST_SETS:-}"
  sets+=("${extra[@]}")
  timeout 120 "${c[@]}" submit examples/fashion-convnet.yaml "${sets[@]}" --set epochs=1 --wait --json \
    > "$out/$name/uninterrupted.json" 2> "$out/$name/uninterrupted.log"
  job_line "$out/$name/uninterrupted.json" uninterrupted 64
  if [[ " $* " == *commit_steps=true* ]]; then
    timeout 120 "${c[@]}" submit examples/fashion-convnet.yaml "${sets[@]}" --set commit_steps=false --set epochs=1 \
      --wait --json > "$out/$name/uncommitted.json" 2> "$out/$name/uncommitted.log"
    job_line "$out/$name/uncommitted.json" "uninterrupted, commit_steps false" 64
  fi
  job=$("${c[@]}" submit examples/fashion-convnet.yaml "${sets[@]}" --set epochs=1)
  for i in $(seq 1200); do  # at most a minute
    [ "$("${c[@]}" status "$job" --json 2> /dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("steps", 0))')" -ge 250 ] && break
    sleep 0.05
  done
  kill -9 "${pids[2]}"
  killed_ms=$(date +%s%3N)
  timeout 120 "${c[@]}" status "$job" --wait --json > "$out/$name/lost.json" 2> "$out/$name/lost.log"
  python3 - "$out/$name/uninterrupted.json" "$out/$name/lost.json" "$killed_ms" <<'PY'
import json, sys
a, b, killed = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
print("uninterrupted: %s, digest %s" % (a.get("state"), a.get("param_digest", "")[:16]))
print("lost server:   %s, digest %s, lost for good: %s" % (b.get("state"), b.get("param_digest", "")[:16], b.get("lost_servers")))
for j, what in ((a, "uninterrupted"), (b, "lost server")):
    print("  %s: last epoch's mean loss %.7f, test accuracy %s" % (what, j["epochs"][-1]["mean_loss"], j.get("eval_accuracy")))
for e in b.get("events", []):
    if e["unix_ms"] >= killed - 1000:
        print("  %+7.2f s  %s" % ((e["unix_ms"] - killed) / 1000.0, e["event"][:150]))
PY
  kill "${pids[@]}" 2> /dev/null
  wait 2> /dev/null
  rm -rf "$run"
}

run_parts fold "$@"
