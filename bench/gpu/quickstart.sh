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

run_parts fold "$@"
