#!/bin/sh
# What clipping by the global gradient norm costs a step (CPU or one GPU): the same
# 4-stage job with clip_grad_norm 0 (no extra call) and 1.0 (every stage
# reports its share, the coordinator sends the factor back in ApplyStep),
# run alternately ROUNDS times; prints each run's steady time per step.
#   bench/clip_cost.sh [ROUNDS]        (B=build/bin, DEVICE=cpu by default;
#                                       DEVICE=cuda puts the 4 stages on the GPUs:
#                                       all on cuda:0 on a one-GPU machine)
set -eu
B=${B:-build/bin}
ROUNDS=${1:-3}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
round=0
while [ "$round" -lt "$ROUNDS" ]; do
  for clip in 0 1.0; do
    cat > "$DIR/job.yaml" <<JOB
name: clip-$clip
model: {name: mlp, input_dim: 32, hidden: [64, 64, 32]}
partition: {stages: 4}
data: {name: synthetic, train_samples: 8192}
batch_size: 32
micro_batches: 4
schedule: 1f1b
optimizer: {name: adamw, lr: 0.001, no_decay: [bias]}
clip_grad_norm: $clip
steps: 400
JOB
    "$B/conveyor" local "$DIR/job.yaml" --json --device "${DEVICE:-cpu}" 2>/dev/null |
      python3 -c 'import json, sys; j = json.load(sys.stdin); sps = j["steady_samples_per_second"]; print("clip_grad_norm %s: %.3f ms a step (%d steps)" % (sys.argv[1], 32e3 / sps, j["steps"]))' "$clip"
  done
  round=$((round + 1))
done
