#!/usr/bin/env bash
# The two-GPU runs of issue 22 on a machine with 2 GPUs (the device tool's
# nvidia-h100-x2 or nvidia-h200-x2), in parts that each fit one 10-minute device
# call after a build (about 2 minutes on 32 cores; keep build/ between calls
# while the machine stays warm, or begin each call with `build`). Every call
# carries .gpu (../shared/gpu/README.md: the libraries, gloo's headers in
# .gpu/gloo-include for replicas, and for `dp` the Fashion-MNIST package):
#
#   scripts/two-gpus.sh build       build into build/ against the wheel's LibTorch
#   scripts/two-gpus.sh tests       ctest -L gpu (recovery on an NCCL link among them), the NCCL equality suite
#   scripts/two-gpus.sh transport   transport_bench over NCCL at 1 MB and 64 MB
#   scripts/two-gpus.sh w2          W2 pipelined against PyTorch eager, torch.compile and torch-pp, with timelines
#   scripts/two-gpus.sh w1          W1 at batch 120, 240 and 480: PyTorch's CUDA graph, Conveyor's single device and pipeline
#   scripts/two-gpus.sh dp          the seed's ConvNet on Fashion-MNIST: PyTorch DDP against Conveyor's replicas
#   scripts/two-gpus.sh torchscript W2's decoder as TorchScript over 2 stages against the zoo's gpt
#   (issue 31, "Honest clocks")
#   scripts/two-gpus.sh defaults    the Quick start job's reference on one GPU: defaults, the old defaults
#                                   (LibTorch's threads, no graphs) and PyTorch's loop (bench/dp_fmnist.py)
#   scripts/two-gpus.sh quickstart  the Quick start job over the two GPUs, with its last step's timeline
#   scripts/two-gpus.sh sendrecv    PyTorch's NCCL send/recv at 1 MB and 64 MB, as transport_bench measures
#   scripts/two-gpus.sh clocks      W2 and W1 single-device rows, each Conveyor row checked from outside
#   scripts/two-gpus.sh outside     W1 at batch 120: the single device, one stage server and two stages (two steps
#                                   in flight), 100 steps, every row the median of 3 runs, each Conveyor row checked
#                                   from outside with 20 s more of steps
#   scripts/two-gpus.sh warmup      W1 over two stages with graphs, five runs: their recoveries (the hang around
#                                   graph recording that the coordinator's GraphWarmup keeps steps apart for)
#   scripts/two-gpus.sh fold        the Quick start job (2 epochs) on two GPUs as `conveyor local` runs it (folded
#                                   into one stage server per GPU) and as 4 servers (--stages 4), on four GPUs
#                                   where there are four, its reference on one GPU, and the fold's GPU test;
#                                   folded with 8 hardware queues (CUDA's default) against one (conveyor local's)
#   scripts/two-gpus.sh nccl-env    transport_bench's 1 MB frame over NCCL under NCCL's chunk and channel settings
#   scripts/two-gpus.sh four-w2     (four GPUs) W2 over 4 stages: Conveyor 1F1B and interleaved against
#                                   torch.distributed.pipelining over 4 ranks and PyTorch on one GPU
#   scripts/two-gpus.sh four-2x2    (four GPUs) W2 as 2 replicas x 2 stages: Conveyor 1F1B and interleaved against
#                                   torch.distributed.pipelining 1F1B with DDP over the copies, and PyTorch on one GPU
#   (issue 32, "Replicas at GPU speed")
#   scripts/two-gpus.sh replicas    the replicas' GPU tests (NCCL collectives; 2 x 2 where there are four GPUs)
#   scripts/two-gpus.sh replicas-dp W1 as 2 x 1 at batch 240 (DP_BATCHES) against DDP, eager and captured (and one
#                                   GPU, DP_VARIANTS), each Conveyor row checked from outside (about 320 s a batch)
#   scripts/two-gpus.sh w2-replicas W2 as 2 x 1 with AdamW, ZeRO-1 off and on: each copy's step time and peak memory,
#                                   over NVLink and through sockets only (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE)
#   scripts/two-gpus.sh overhead    W1 on one stage server at batch 240 against the reference, and 2 x 1 at 480:
#                                   each one's profile of step 10 and timeline of its last (30); 2 x 1 again with one
#                                   step in flight, one bucket, and without graphs
#   (issue 35, "Models from PyTorch 2")
#   scripts/two-gpus.sh pt2         tests/fixtures/pt2/export_dynamic.py exports gpt_dyn.pt2 with PyTorch 2 (kept in
#                                   $out/pt2; the fixture is 2.11's), then the exported programs' GPU test
#                                   (live PyTorch 2 against Conveyor, gpt_dyn.pt2 among them)
#   scripts/two-gpus.sh example     examples/your-model's exported path: export_model.py, `conveyor local` over the
#                                   GPUs, load_back.py --exported (PyTorch 2 and Fashion-MNIST from the kit)
#   scripts/two-gpus.sh exported-w2 W2's decoder exported (torch.export, batch dynamic) against the zoo's gpt, one GPU
#                                   and two stages (W2_VARIANTS picks some of bench/torchscript_w2.py's variants;
#                                   the four together outlasted a 10-minute call in the 2026-11-26 runs on 4x H100: give each call
#                                   W2_VARIANTS=zoo-gpt,exported-gpt or zoo-gpt-2stage,exported-gpt-2stage;
#                                   exported-gpt-unfused: the exported one without its head split run as one)
#   (issue 36, "The pipeline at GPU speed")
#   scripts/two-gpus.sh w2-1stage   W2 on one stage server holding the whole model against the reference and PyTorch,
#                                   each Conveyor row checked from outside (20 s more)
#   scripts/two-gpus.sh zb          W2: zero-bubble (split backward, weight passes while waiting) against 1F1B,
#                                   interleaved and torch-pp, with timelines (about 350 s)
#   scripts/two-gpus.sh zb-outside  W2's zero-bubble row (ZB_ROWS, zero-bubble-m8) alone, checked from outside (about 350 s)
#   (issue 54, "Four GPUs near the limit")
#   scripts/two-gpus.sh w2-best     W2 on two GPUs: PyTorch eager on one, every torch.distributed.pipelining schedule
#                                   at 4 and 8 micro-batches (1F1B, interleaved 1F1B, interleaved zero-bubble, ZB-V,
#                                   DualPipeV), Conveyor's zero-bubble (W2_BEST_ROWS), each Conveyor row checked
#                                   from outside (one more run, of 128 steps), with timelines (about 450 s)
#   scripts/two-gpus.sh window      steps_in_flight 1 against 2: W1 at batch 120 (one stage server, two stages)
#                                   and the Quick start job over the GPUs, with timelines
#
# Several parts may follow each other in one call (scripts/two-gpus.sh build tests transport).
# Results (CSV, logs, timelines) go to $OUT (default ./gpu-out); bench/RESULTS.md has what they gave.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
command -v nvidia-smi > /dev/null && [ -f .gpu/env.sh ] && source .gpu/env.sh
export PYTHONUNBUFFERED=1
bin=build/bin
for part in "$@"; do
  case "$part" in
    build)
      gloo=()
      [ -d .gpu/gloo-include ] && gloo=("-DCONVEYOR_GLOO_INCLUDE_DIR=$PWD/.gpu/gloo-include")
      CMAKE_ARGS="${gloo[*]}" BUILD_DIR=build scripts/build.sh > "$out/build.log" 2>&1 ||
        { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; } ;;
    tests)
      timeout 300 ctest --test-dir build -L gpu --timeout 200 --output-on-failure > "$out/ctest-gpu.log" 2>&1
      echo "ctest -L gpu: $(grep -E 'tests passed' "$out/ctest-gpu.log")"
      timeout 120 "$bin/equality_test" --gtest_filter='Nccl/*' > "$out/equality-nccl.log" 2>&1
      echo "equality Nccl/*: $(grep -E 'PASSED|FAILED' "$out/equality-nccl.log" | head -2 | tr '\n' ' ')" ;;
    pt2)
      mkdir -p "$out/pt2"
      timeout 120 python3 tests/fixtures/pt2/export_dynamic.py "$out/pt2" > "$out/pt2/export.log" 2>&1
      echo "export_dynamic.py: exit $?; $(grep -E '^exported with|refused|ran, out|train\(\)' "$out/pt2/export.log" | tr '\n' ' ')"
      timeout 300 "$bin/gpu_test" --gtest_filter='*Exported*' > "$out/pt2/gpu-exported.log" 2>&1
      echo "gpu_test *Exported*: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/pt2/gpu-exported.log" | tr '\n' ' ')"
      tar -czf "$out/pt2.tgz" -C "$out" pt2 && rm -rf "$out/pt2" ;;
    example)  # examples/your-model's exported path as its docs give it: export, train over the GPUs, load back
      ls /usr/share/datasets/fashion-mnist/*.gz > /dev/null 2>&1 || dpkg -x .gpu/dataset-fashion-mnist_*.deb /
      mkdir -p "$out/example" && ex=$(mktemp -d)
      { timeout 120 python3 examples/your-model/export_model.py "$ex" &&
        /usr/bin/time -f "conveyor local: %e s wall" timeout 180 "$bin/conveyor" local "$ex/job.yaml" --json \
          > "$out/example/result.json" &&
        timeout 60 python3 examples/your-model/load_back.py "$ex" --exported; } > "$out/example/example.log" 2>&1
      echo "example: exit $?; $(grep -E '^wrote|wall|test accuracy|rror' "$out/example/example.log" | tr '\n' ' ')"
      rm -rf "$ex" && tar -czf "$out/example.tgz" -C "$out" example && rm -rf "$out/example" ;;
    exported-w2)
      # The exported rows checked from outside: run again W2_OUTSIDE_STEPS (150) steps longer, twice, and once
      # more at their own length. Not the zoo's by default: its start-up (seeding 1.3 B weights on the CPU, 23 to
      # 45 s) varied by 1.5 to 7 s from run to run, too much for a check this short (2026-11-27, 4x H100)
      timeout 560 python3 bench/torchscript_w2.py --bin "$bin" --out "$out/exported-w2" --steps 6 \
        --outside-steps "${W2_OUTSIDE_STEPS:-150}" --outside-variants "${W2_OUTSIDE_VARIANTS:-exported-gpt,exported-gpt-2stage}" \
        --variants "${W2_VARIANTS:-zoo-gpt,exported-gpt,zoo-gpt-2stage,exported-gpt-2stage}" | grep -vE '^epoch' | tail -15
      cp "$out/exported-w2/torchscript-w2.csv" "$out/exported-w2.csv" 2> /dev/null
      rm -f "$out"/exported-w2/*.pt "$out"/exported-w2/*.pt2 "$out"/exported-w2/tokens.bin
      tar -czf "$out/exported-w2.tgz" -C "$out" exported-w2 && rm -rf "$out/exported-w2" ;;
    transport)
      timeout 60 "$bin/transport_bench" --transports nccl --sizes 1M,64M --rounds 5 --nccl-ctas 0 | tee "$out/transport.txt" ;;
    w2)
      timeout 560 python3 bench/bench.py w2 --bin "$bin" --steps 6 --timeout 130 --out "$out/w2" \
        --only 'pytorch-1gpu,pytorch-1gpu-compile,torch-pp-1f1b-m8,conveyor-1dev,1f1b-m8,interleaved-m8' \
        --trace-dir "$out/w2/timelines" | grep -A10 '^| variant' ;;
    w1)
      for b in 120 240 480; do  # pipelined runs with graphs: nccl_ctas 0 (the example's) becomes 2 under them
        timeout 180 python3 bench/bench.py w1 --bin "$bin" --global-batch "$b" --micro-batches 2,4,8 --graphs \
          --only "pytorch-1gpu-graph-b$b,torch-pp-1f1b-m4-b$b,conveyor-1dev-graphs-b$b,1f1b-m4-graphs-b$b,1f1b-m8-graphs-b$b" \
          --steps 10 --timeout 90 --out "$out/w1" --trace-dir "$out/w1/timelines" | grep -A8 '^| variant'
      done ;;
    dp)
      ls /usr/share/datasets/fashion-mnist/*.gz > /dev/null 2>&1 || dpkg -x .gpu/dataset-fashion-mnist_*.deb /
      timeout 200 python3 bench/dp_fmnist.py --bin "$bin" --out "$out/dp" --epochs 3 \
        --variants pytorch-1gpu,pytorch-ddp-2,conveyor-1dev,conveyor-2x1,conveyor-2x1-eager | grep '^|' ;;
    torchscript)
      timeout 400 python3 bench/torchscript_w2.py --bin "$bin" --out "$out/torchscript" \
        --variants zoo-gpt-2stage,torchscript-gpt-2stage --steps 6 | grep -vE '^epoch' | tail -15 ;;
    defaults)
      ls /usr/share/datasets/fashion-mnist/*.gz > /dev/null 2>&1 || dpkg -x .gpu/dataset-fashion-mnist_*.deb /
      mkdir -p "$out/defaults"
      sed 's/^epochs: 3/epochs: 3\ncuda_graphs: false/' examples/fashion-convnet.yaml > "$out/defaults/old.yaml"
      for v in new old; do
        job=examples/fashion-convnet.yaml threads=()
        [ $v = old ] && job="$out/defaults/old.yaml" threads=(--threads "$(nproc)")
        /usr/bin/time -f "$v: %e s wall" timeout 150 "$bin/conveyor" train "$job" --reference --device cuda:0 --json \
          "${threads[@]}" > "$out/defaults/ref-$v.json" 2> "$out/defaults/ref-$v.log"
        tail -1 "$out/defaults/ref-$v.log"
        python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], [round(e['train_seconds'],2) for e in j['epochs']], j['events'] if 'events' in j else '')" \
          "$out/defaults/ref-$v.json" "$v" 2>&1 | tail -1
      done
      timeout 150 python3 bench/dp_fmnist.py --bin "$bin" --out "$out/defaults/dp" --epochs 3 \
        --variants pytorch-1gpu,conveyor-1dev | grep '^|' ;;
    quickstart)
      ls /usr/share/datasets/fashion-mnist/*.gz > /dev/null 2>&1 || dpkg -x .gpu/dataset-fashion-mnist_*.deb /
      mkdir -p "$out/quickstart"
      /usr/bin/time -f "quickstart: %e s wall" timeout 240 "$bin/conveyor" local examples/fashion-convnet.yaml --json \
        --trace "$out/quickstart/timeline" --curves "$out/quickstart/curves.png" > "$out/quickstart/qs.json" 2> "$out/quickstart/qs.log"
      tail -1 "$out/quickstart/qs.log"
      python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('epochs', [round(e['train_seconds'],2) for e in j['epochs']], 'acc', j['eval_accuracy']); [print(' stage', s.get('index'), s.get('device'), 'busy', round(s.get('busy_fraction',0),3), 'graphed', s.get('graphed_steps')) for s in j.get('stages',[])]" \
        "$out/quickstart/qs.json" 2>&1 | tail -6 ;;
    fold)
      ls /usr/share/datasets/fashion-mnist/*.gz > /dev/null 2>&1 || dpkg -x .gpu/dataset-fashion-mnist_*.deb /
      mkdir -p "$out/fold"
      gpus=$(nvidia-smi -L | wc -l)
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
        python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], 'epochs', [round(e['train_seconds'],2) for e in j['epochs']], 'steady ms/step', round(1000*64/j['steady_samples_per_second'],3), 'loss', round(j['epochs'][-1]['mean_loss'],5), [round(s.get('busy_fraction',0),3) for s in j.get('stages',[])])" \
          "$out/fold/$name.json" "$name" 2>&1 | tail -1
      done
      timeout 60 stdbuf -oL "$bin/gpu_test" --gtest_filter='*Fold*' > "$out/fold/gpu-test.log" 2>&1
      echo "fold's GPU test: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/fold/gpu-test.log" | tr '\n' ' ')"
      tar -czf "$out/fold.tgz" -C "$out" fold && rm -rf "$out/fold" ;;
    four-w2)  # issue 36 item 4: W2 over four stages against torch.distributed.pipelining over four ranks
      timeout 500 python3 bench/bench.py w2 --bin "$bin" --ranks 4 --steps 6 --micro-batches 8 --outside-steps 0 \
        --only 'pytorch-1gpu,torch-pp-1f1b-m8,1f1b-m8,interleaved-m8' --timeout 130 --out "$out/four-w2" \
        --trace-dir "$out/four-w2/timelines" | grep -A8 '^| variant'
      tar -czf "$out/four-w2.tgz" -C "$out" four-w2 && rm -rf "$out/four-w2" ;;
    four-2x2)  # issue 36 item 4: W2 as 2 replicas x 2 stages against torch.distributed.pipelining with DDP
      # Each copy trains on 16 of the 32 samples; PyTorch's stages are wrapped in DDP over the copies
      # (FOUR_DP=allreduce: its gradients all-reduced after the schedule's step instead).
      timeout 540 python3 bench/bench.py w2 --bin "$bin" --ranks 2 --replicas 2 --dp "${FOUR_DP:-ddp}" --steps 6 \
        --micro-batches 4 --outside-steps 0 --only 'pytorch-1gpu,torch-pp-1f1b-m4-r2,1f1b-m4-r2,interleaved-m4-r2' \
        --timeout 130 --out "$out/four-2x2" --trace-dir "$out/four-2x2/timelines" | grep -A8 '^| variant'
      tar -czf "$out/four-2x2.tgz" -C "$out" four-2x2 && rm -rf "$out/four-2x2" ;;
    nccl-env)
      for e in NONE=1 NCCL_P2P_NVL_CHUNKSIZE=131072 NCCL_P2P_NVL_CHUNKSIZE=262144 NCCL_MIN_P2P_NCHANNELS=8 \
               NCCL_PROTO=LL128 NCCL_PROTO=LL; do
        echo "$e: $(env "$e" timeout 60 "$bin/transport_bench" --transports nccl --sizes 1M --rounds 9 --nccl-ctas 0 | tail -1)"
      done ;;
    sendrecv)
      timeout 120 python3 bench/transport/torch_sendrecv.py --sizes 1M,64M --rounds 5 --csv "$out/sendrecv.csv" ;;
    clocks)
      timeout 300 python3 bench/bench.py w2 --bin "$bin" --steps 6 --timeout 130 --out "$out/clocks" \
        --only 'pytorch-1gpu,conveyor-1dev,conveyor-1dev-eager' | grep -A6 '^| variant'
      timeout 200 python3 bench/bench.py w1 --bin "$bin" --steps 10 --timeout 90 --out "$out/clocks" \
        --only 'pytorch-1gpu-cl,pytorch-1gpu-graph,conveyor-1dev,conveyor-1dev-eager' | grep -A7 '^| variant' ;;
    outside)
      # 100 steps inside and 20 s more outside: with 18 to 28 steps and 15 s, start-up effects and the
      # start-up's spread (seconds for two GPUs) left rows unjudged (bench/RESULTS.md, 2026-11-26, 2x H100); each
      # row the median of 3 runs: one two-GPU run was 8% off the others (2026-11-26, 2x H100)
      timeout 560 python3 bench/bench.py w1 --bin "$bin" --global-batch 120 --micro-batches 4 --graphs --steps 100 \
        --repeats 3 --outside-seconds 20 --timeout 150 --out "$out/outside" \
        --only 'pytorch-1gpu-graph-b120,conveyor-1dev-b120,conveyor-1stage-graphs-b120,1f1b-m4-graphs-b120' \
        | grep -A8 "^| variant"
      tar -czf "$out/outside.tgz" -C "$out" outside && rm -rf "$out/outside" ;;
    warmup)
      mkdir -p "$out/warmup"
      for r in $(seq "${WARMUP_RUNS:-5}"); do
        timeout 100 python3 bench/bench.py w1 --bin "$bin" --global-batch 120 --micro-batches 4 --graphs \
          --only 1f1b-m4-graphs-b120 --steps 20 --outside-steps 0 --timeout 80 --out "$out/warmup/$r" \
          > "$out/warmup/$r.txt" 2>&1
        echo "warmup run $r: $(grep -E '^\| 1f1b' "$out/warmup/$r.txt" | cut -d'|' -f3) ms/step;" \
          "$(grep -ohE 'recoveries [0-9]+' "$out/warmup/$r"/*.log | head -1)"
      done
      tar -czf "$out/warmup.tgz" -C "$out" warmup && rm -rf "$out/warmup" ;;
    replicas)
      timeout 150 "$bin/stage_server_test" --gtest_filter='*Nccl*:ReplicaGroup.*:GradientReducer.*' \
        > "$out/replicas-unit.log" 2>&1
      echo "stage_server_test replicas: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/replicas-unit.log" | tr '\n' ' ')"
      timeout 200 "$bin/gpu_test" --gtest_filter='*Replica*:*Nccl*:*Zero*' > "$out/replicas-gpu.log" 2>&1
      echo "gpu_test replicas: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/replicas-gpu.log" | tr '\n' ' ')" ;;
    replicas-dp)
      # W1 as 2 x 1 against DDP, 100 steps after 2 warm-up on both sides; Conveyor's rows also give their steady
      # steps' median and are checked from outside: each run again DP_OUTSIDE_STEPS (600) longer, twice, and once
      # more at its own length, the shortest walls counting (the 2026-11-27 4x H100 runs' single runs of 300 more put rows at 0.77x
      # to 1.20x their own clocks: start-up varies by seconds). DDP and 2 x 1 took 245 to 290 s a batch (session
      # 27), DDP with its step captured in a CUDA graph (the strongest PyTorch row) about 35 s more, last in case its
      # capture fails or hangs: one batch a call (DP_BATCHES, 240 by default: the batch where 2 x 1 leads the
      # captured DDP by the least); conveyor-1dev adds about 150 s (DP_VARIANTS). Each row's line is kept in
      # dp-w1-b$b.log as it comes, and dp-gpu.csv after each row (a batch cut by its timeout keeps the rows it
      # finished).
      for b in ${DP_BATCHES:-240}; do  # replicas replay CUDA graphs (auto); -eager: cuda_graphs false
        mkdir -p "$out/dp-w1-b$b"
        timeout 400 python3 bench/dp_gpu.py --bin "$bin" --batch "$b" --steps "${DP_STEPS:-100}" --out "$out/dp-w1-b$b" \
          --outside-steps "${DP_OUTSIDE_STEPS:-600}" \
          --variants "${DP_VARIANTS:-pytorch-ddp,conveyor-rx1,pytorch-ddp-graph}" 2>&1 | tee "$out/dp-w1-b$b.log" | grep '^|'
      done ;;
    w2-replicas)  # issue 32: W2 as 2 x 1 (one GPU a copy) with AdamW, ZeRO-1 off and on: step time, peak memory;
      # then the same with NCCL through sockets only, as between two hosts (item 4). Without CUDA graphs:
      # W2's graphs at batch 32 do not fit beside the eager first step on one H100, and a stage server has
      # no eager fallback for that.
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
      tar -czf "$out/w2-replicas.tgz" -C "$out" w2-replicas && rm -rf "$out/w2-replicas" ;;
    w2-1stage)  # issue 36 item 1 on W2: one stage server holding the whole model against the reference, from outside too
      timeout 560 python3 bench/bench.py w2 --bin "$bin" --steps 10 --outside-seconds 20 --timeout 130 \
        --out "$out/w2-1stage" --only 'pytorch-1gpu,conveyor-1dev,conveyor-1stage' | grep -A6 '^| variant'
      tar -czf "$out/w2-1stage.tgz" -C "$out" w2-1stage && rm -rf "$out/w2-1stage" ;;
    overhead)
      # The profiled step (10) ends on the host (its collectives waited for there, its trace written): the
      # timeline is the last step's (30), a steady one; the variants after the first three are not profiled.
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
      tar -czf "$out/overhead.tgz" -C "$out" overhead && rm -rf "$out/overhead" && ls -la "$out/overhead.tgz" ;;
    zb)  # issue 36 item 3: zero-bubble with its split backward (2026-11-27, 4x H100) against 1F1B, interleaved and torch-pp
      # on W2, one call (about 350 s after a build)
      timeout 420 python3 bench/bench.py w2 --bin "$bin" --steps 6 --outside-steps 0 --timeout 130 --out "$out/zb" \
        --only 'pytorch-1gpu,torch-pp-1f1b-m8,1f1b-m8,interleaved-m8,zero-bubble-m4,zero-bubble-m8' \
        --trace-dir "$out/zb/timelines" | grep -A9 '^| variant'
      tar -czf "$out/zb.tgz" -C "$out" zb && rm -rf "$out/zb" ;;
    zb-outside)  # the zero-bubble row (ZB_ROWS) alone, checked from outside (the zoo's W2 start-up varies by
      # seconds: 60 s more of steps, two runs of each length: four starts of about 45 s; 190 s was not enough)
      timeout 420 python3 bench/bench.py w2 --bin "$bin" --steps 6 --outside-seconds 60 --timeout 130 \
        --out "$out/zb-outside" --only "${ZB_ROWS:-zero-bubble-m8}" | grep -A3 '^| variant'
      tar -czf "$out/zb-outside.tgz" -C "$out" zb-outside && rm -rf "$out/zb-outside" ;;
    w2-best)
      timeout "${W2_BEST_TIMEOUT:-560}" python3 bench/bench.py w2 --bin "$bin" --steps 8 --micro-batches 4,8 --timeout 130 \
        --torch-schedules 1f1b,interleaved,interleaved-zb,zbv,dualpipev --outside-steps 128 --outside-repeats 1 \
        --only "pytorch-1gpu,torch-pp-*,${W2_BEST_ROWS:-zero-bubble-m4,zero-bubble-m8}" --out "$out/w2-best" \
        --trace-dir "$out/w2-best/timelines" > "$out/w2-best.log" 2>&1
      sed -n '/^W2 (/,/^$/p' "$out/w2-best.log"; grep -E 'not measured|failed|past' "$out/w2-best.log" ;;
    window)
      ls /usr/share/datasets/fashion-mnist/*.gz > /dev/null 2>&1 || dpkg -x .gpu/dataset-fashion-mnist_*.deb /
      mkdir -p "$out/window"
      for k in 1 2; do  # the single-device rows (steps_in_flight does not apply to them) once
        rows='conveyor-1stage-graphs-b120,1f1b-m4-graphs-b120'
        [ $k = 1 ] && rows="pytorch-1gpu-graph-b120,conveyor-1dev-graphs-b120,$rows"
        timeout 200 python3 bench/bench.py w1 --bin "$bin" --global-batch 120 --micro-batches 4 --graphs \
          --only "$rows" --steps 20 --outside-steps 0 --set "steps_in_flight=$k" --timeout 90 \
          --out "$out/window/w1-k$k" | grep -A6 '^| variant'
      done
      for k in 1 2; do
        timeout 150 "$bin/conveyor" local examples/fashion-convnet.yaml --set "steps_in_flight=$k" --json \
          --trace "$out/window/qs-k$k-timeline" > "$out/window/qs-k$k.json" 2> "$out/window/qs-k$k.log"
        python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('quickstart steps_in_flight', sys.argv[2], 'epochs', [round(e['train_seconds'],2) for e in j['epochs']], 'steady ms/step', round(1000*64/j['steady_samples_per_second'],3), 'acc', j['eval_accuracy'], [round(s.get('busy_fraction',0),3) for s in j.get('stages',[])])" \
          "$out/window/qs-k$k.json" "$k" 2>&1 | tail -1
      done
      tar -czf "$out/window.tgz" -C "$out" window && rm -rf "$out/window" ;;
    *) sed -n '2,/^set -uo/p' "$0" | sed '$d' >&2; exit 2 ;;
  esac
done
