#!/usr/bin/env bash
# How do Conveyor's replicas (data parallelism, one GPU a copy) compare with PyTorch's DDP? Two GPUs,
# after bench/gpu/build.sh; the kit must carry gloo's headers (.gpu/gloo-include) for the build, and
# Fashion-MNIST's package for fmnist. bench/gpu/tests.sh replicas runs the replicas' tests.
#
#   bench/gpu/replicas.sh            the default, w1: W1 as 2 x 1 at batch 240 (DP_BATCHES) against DDP, eager
#                                    and with its step captured in a CUDA graph (DP_VARIANTS; add conveyor-1dev
#                                    for one GPU, about 150 s more), 100 steps (DP_STEPS) after 2 warm-up on
#                                    both sides, each Conveyor row checked from outside (DP_OUTSIDE_STEPS, 600);
#                                    about 320 s a batch            $out/dp-w1-b240.log, $out/dp-w1-b240/
#   bench/gpu/replicas.sh fmnist     the Quick start's ConvNet on Fashion-MNIST, 3 epochs: PyTorch on one GPU
#                                    and DDP over two against Conveyor's single device and 2 x 1, graphed and
#                                    eager                                                     $out/dp/
#   bench/gpu/replicas.sh w2         W2 as 2 x 1 with AdamW, ZeRO-1 off and on: each copy's step time and
#                                    peak memory, over NVLink and through sockets only (NCCL_P2P_DISABLE,
#                                    NCCL_SHM_DISABLE, as between two hosts)            $out/w2-replicas.tgz
#   bench/gpu/replicas.sh overhead   where a 2 x 1 step goes: W1 on one stage server at batch 240 against the
#                                    reference, and 2 x 1 at 480, each one's profile of step 10 and timeline of
#                                    its last (30); 2 x 1 again with one step in flight, one bucket, and
#                                    without graphs                                       $out/overhead.tgz
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"

part_w1() {
  # Conveyor's rows also give their steady steps' median and are checked from outside: each run again
  # DP_OUTSIDE_STEPS longer, twice, and once more at its own length, the shortest walls counting (start-up
  # varies by seconds). The captured DDP (the strongest PyTorch row) comes last in case its capture fails or
  # hangs. Each row's line is kept in dp-w1-b$b.log as it comes, and dp-gpu.csv after each row (a batch cut
  # by its timeout keeps the rows it finished). Batch 240 is where 2 x 1 leads the captured DDP by the least.
  local b
  for b in ${DP_BATCHES:-240}; do  # replicas replay CUDA graphs (auto); -eager: cuda_graphs false
    mkdir -p "$out/dp-w1-b$b"
    timeout 400 python3 bench/dp_gpu.py --bin "$bin" --batch "$b" --steps "${DP_STEPS:-100}" --out "$out/dp-w1-b$b" \
      --outside-steps "${DP_OUTSIDE_STEPS:-600}" \
      --variants "${DP_VARIANTS:-pytorch-ddp,conveyor-rx1,pytorch-ddp-graph}" 2>&1 | tee "$out/dp-w1-b$b.log" | grep '^|'
  done
}

part_fmnist() {
  fashion_mnist
  timeout 200 python3 bench/dp_fmnist.py --bin "$bin" --out "$out/dp" --epochs 3 \
    --variants pytorch-1gpu,pytorch-ddp-2,conveyor-1dev,conveyor-2x1,conveyor-2x1-eager | grep '^|'
}

part_w2() {
  # Without CUDA graphs: W2's graphs at batch 32 do not fit beside the eager first step on one H100, and a
  # stage server has no eager fallback for that.
  local net envs zero name
  mkdir -p "$out/w2-replicas"
  for net in nvlink sockets; do
    envs=()
    [ $net = sockets ] && envs=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
    for zero in 0 1; do
      name=$net-zero$zero
      /usr/bin/time -f "%e s wall" env "${envs[@]}" timeout 240 "$bin/conveyor" local examples/gpt-w2.yaml --json \
        --set partition.stages=1 --set replicas=2 --set micro_batches=4 --set steps=12 --set cuda_graphs=false \
        --set "optimizer={name: adamw, lr: 0.0001}" --set "zero=$zero" --trace "$out/w2-replicas/$name-timeline" \
        > "$out/w2-replicas/$name.json" 2> "$out/w2-replicas/$name.log"
      python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('W2 2x1', sys.argv[2], 'ms/step', round(1000*32/j['steady_samples_per_second'],1), 'loss', j.get('final_loss'), [(s.get('replica'), round(s['memory'].get('device_peak_bytes',0)/2**30,2), round(s['memory'].get('optimizer_state_bytes',0)/2**30,2)) for s in j.get('stages',[])], '(replica, peak GiB, optimizer GiB)')" \
        "$out/w2-replicas/$name.json" "$name" 2>&1 | tail -1
      tail -1 "$out/w2-replicas/$name.log"
    done
  done
  pack w2-replicas
}

part_overhead() {
  # The profiled step (10) ends on the host (its collectives waited for there, its trace written): the
  # timeline is the last step's (30), a steady one; the variants after the first three are not profiled.
  local v profile sets
  mkdir -p "$out/overhead"
  for v in "ref 240 1 -" "stage 240 1 -" "replicas 480 2 -" "replicas-k1 480 2 steps_in_flight=1" \
           "replicas-1bucket 480 2 bucket_cap_mb=200" "replicas-eager 480 2 cuda_graphs=false"; do
    set -- $v
    profile="profile_step: 10" sets=()
    [ "$4" != - ] && profile="" sets=(--set "$4")
    python3 -c "import sys; sys.path.insert(0, 'bench'); import dp_gpu; print(dp_gpu.job_text($2, 30, $3) + '$profile')" \
      > "$out/overhead/$1.yaml"
    if [ "$1" = ref ]; then
      timeout 120 "$bin/conveyor" train "$out/overhead/$1.yaml" --reference --device cuda:0 --json \
        --profile-dir "$out/overhead" > "$out/overhead/$1.json" 2> "$out/overhead/$1.log"
    else
      timeout 150 "$bin/conveyor" local "$out/overhead/$1.yaml" --stages "$3" --json --trace "$out/overhead/$1-timeline" \
        --profile-dir "$out/overhead" "${sets[@]}" > "$out/overhead/$1.json" 2> "$out/overhead/$1.log"
    fi
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], 'ms/step', round(1000*$2/j['steady_samples_per_second'],2), [(s.get('replica'), round(s.get('busy_fraction',0),3)) for s in j.get('stages',[])])" \
      "$out/overhead/$1.json" "$1" 2>&1 | tail -1
  done
  pack overhead
  ls -la "$out/overhead.tgz"
}

run_parts w1 "$@"
