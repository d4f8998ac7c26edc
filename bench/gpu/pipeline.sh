#!/usr/bin/env bash
# How fast is Conveyor's pipeline here? W2 (the GPT decoder, examples/gpt-w2.yaml) pipelined over the
# GPUs against PyTorch eager on one GPU and torch.distributed.pipelining's schedules, after
# bench/gpu/build.sh. CUDA_VISIBLE_DEVICES picks the GPUs (CUDA_VISIBLE_DEVICES=0,1 for two of four).
#
#   bench/gpu/pipeline.sh            the default, best: what it finds decides
#     2 GPUs: PyTorch eager on one, every torch.distributed.pipelining schedule at 4 and 8 micro-batches
#       (1F1B, interleaved 1F1B, interleaved zero-bubble, ZB-V, DualPipeV), Conveyor's zero-bubble
#       (W2_BEST_ROWS, zero-bubble-m4,zero-bubble-m8), each Conveyor row checked from outside (one more
#       run, of 128 steps), with timelines; about 450 s (W2_BEST_TIMEOUT, 560)
#                                                     $out/w2-best.log, $out/w2-best/ (CSV, logs, timelines)
#     4 GPUs or more: PyTorch eager on one GPU, torch.distributed.pipelining over 4 ranks at 8 and 16
#       micro-batches (1F1B, interleaved zero-bubble, ZB-V, DualPipeV), Conveyor over 4 stages
#       (FOUR_ROWS, interleaved-m8,zero-bubble-m8) and as 2 x 2 (ZB_2X2, zero-bubble-m4-r2; IL_2X2,
#       interleaved-m4-r2, the last checked from outside), with timelines, in one table; about 390 s
#                                                     $out/w2-best/{four,zb2x2,il2x2}.{csv,log}, table.md
#   bench/gpu/pipeline.sh schedules  W2 on two GPUs: zero-bubble (split backward, weight passes while
#                                    waiting) against 1F1B, interleaved and torch.distributed.pipelining's
#                                    1F1B, with timelines; about 350 s                      $out/zb.tgz
#   bench/gpu/pipeline.sh zbv        W2 over every GPU given: Conveyor's zbv (two chunks a GPU in a V) against
#                                    its zero-bubble and torch.distributed.pipelining's ZB-V and DualPipeV, at
#                                    ZBV_MBS micro-batches (4,8), rows picked by ZBV_ONLY, with timelines; about
#                                    40 s a row                                $out/zbv-N.{log,csv}, $out/zbv-N.tgz
#   bench/gpu/pipeline.sh compile    W2 on two GPUs: 1F1B and interleaved against PyTorch eager, torch.compile
#                                    and torch.distributed.pipelining's 1F1B, with timelines     $out/w2/
#   bench/gpu/pipeline.sh zb-outside W2's zero-bubble row (ZB_ROWS, zero-bubble-m8) alone, checked from
#                                    outside with 60 s more of steps; about 350 s        $out/zb-outside.tgz
#   bench/gpu/pipeline.sh 2x2        (four GPUs) W2 as 2 replicas x 2 stages: Conveyor 1F1B and interleaved
#                                    against torch.distributed.pipelining's 1F1B with DDP over the copies
#                                    (FOUR_DP=allreduce: its gradients all-reduced after the schedule's step
#                                    instead), and PyTorch on one GPU                      $out/four-2x2.tgz
#   bench/gpu/pipeline.sh w1         W1 (ResNet50) at batch 120, 240 and 480: PyTorch's CUDA graph, Conveyor's
#                                    single device and pipeline with graphs                      $out/w1/
#   bench/gpu/pipeline.sh window     steps_in_flight 1 against 2: W1 at batch 120 (one stage server, two
#                                    stages) and the Quick start job over the GPUs, with timelines
#                                                                                        $out/window.tgz
# Each part prints its table (ms per step, ratios to PyTorch; bench/README.md reads it); the CSVs merge
# with `bench/bench.py plot --csv A.csv B.csv`. Several parts may follow each other in one call, each
# within one 10-minute device call.
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"

part_best() {
  if [ "$(gpu_count)" -ge 4 ]; then best_four; else best_two; fi
}

best_two() {
  timeout "${W2_BEST_TIMEOUT:-560}" python3 bench/bench.py w2 --bin "$bin" --steps 8 --micro-batches 4,8 --timeout 130 \
    --torch-schedules 1f1b,interleaved,interleaved-zb,zbv,dualpipev --outside-steps 128 --outside-repeats 1 \
    --only "pytorch-1gpu,torch-pp-*,${W2_BEST_ROWS:-zero-bubble-m4,zero-bubble-m8}" --out "$out/w2-best" \
    --trace-dir "$out/w2-best/timelines" > "$out/w2-best.log" 2>&1
  sed -n '/^W2 (/,/^$/p' "$out/w2-best.log"
  grep -E 'not measured|failed|past' "$out/w2-best.log"
}

best_four() {
  local d=$out/w2-best start
  mkdir -p "$d"
  start=$(date +%s)
  # shellcheck disable=SC2154  # budget: given on each call's command line
  best_run() {  # one bench.py run of the table, bounded by $budget seconds: its log, and its rows on stdout
    local name=$1
    shift
    timeout "$budget" python3 bench/bench.py w2 --bin "$bin" --steps 8 --timeout 120 --out "$d/$name" \
      --csv "$d/$name.csv" --trace-dir "$d/timelines" "$@" > "$d/$name.log" 2>&1
    echo "$name: exit $? after $(( $(date +%s) - start )) s"
    grep -E '^  [a-z]' "$d/$name.log"
  }
  # ScheduleInterleaved1F1B is left out: slower than 1F1B over 4 ranks and than its zero-bubble form over 2
  budget=330 best_run four --ranks 4 --micro-batches 8,16 --outside-steps 0 \
    --torch-schedules 1f1b,interleaved-zb,zbv,dualpipev \
    --only "pytorch-1gpu,torch-pp-*,${FOUR_ROWS:-interleaved-m8,zero-bubble-m8}"
  budget=90 best_run zb2x2 --ranks 2 --replicas 2 --micro-batches 4 --outside-steps 0 --only "${ZB_2X2:-zero-bubble-m4-r2}"
  # checked from outside: one more run, of 128 steps (fewer are too short to judge 5% on W2)
  budget=$(( 585 - ($(date +%s) - start) )) best_run il2x2 --ranks 2 --replicas 2 --micro-batches 4 --outside-steps 128 \
    --outside-repeats 1 --only "${IL_2X2:-interleaved-m4-r2}"
  python3 bench/bench.py plot --csv "$d"/four.csv "$d"/zb2x2.csv "$d"/il2x2.csv --out "$d" > "$d/table.md" 2>&1
  cat "$d/table.md"
}

part_zbv() {
  local g d
  g=$(gpu_count)
  d=$out/zbv-$g
  timeout "${ZBV_TIMEOUT:-560}" python3 bench/bench.py w2 --bin "$bin" --ranks "$g" --steps 8 --timeout 120 \
    --micro-batches "${ZBV_MBS:-4,8}" --outside-steps 0 --torch-schedules zbv,dualpipev --out "$d" --csv "$d.csv" \
    --only "${ZBV_ONLY:-pytorch-1gpu,torch-pp-*,zero-bubble-m*,zbv-m*}" --trace-dir "$d/timelines" > "$d.log" 2>&1
  sed -n '/^W2 (/,/^$/p' "$d.log"
  grep -E 'not measured|failed|past' "$d.log"
  pack "zbv-$g"
}

part_schedules() {
  timeout 420 python3 bench/bench.py w2 --bin "$bin" --steps 6 --outside-steps 0 --timeout 130 --out "$out/zb" \
    --only 'pytorch-1gpu,torch-pp-1f1b-m8,1f1b-m8,interleaved-m8,zero-bubble-m4,zero-bubble-m8' \
    --trace-dir "$out/zb/timelines" | grep -A9 '^| variant'
  pack zb
}

part_compile() {
  timeout 560 python3 bench/bench.py w2 --bin "$bin" --steps 6 --timeout 130 --out "$out/w2" \
    --only 'pytorch-1gpu,pytorch-1gpu-compile,torch-pp-1f1b-m8,conveyor-1dev,1f1b-m8,interleaved-m8' \
    --trace-dir "$out/w2/timelines" | grep -A10 '^| variant'
}

part_zb_outside() {
  # the zoo's W2 start-up varies by seconds: 60 s more of steps, two runs of each length
  timeout 420 python3 bench/bench.py w2 --bin "$bin" --steps 6 --outside-seconds 60 --timeout 130 \
    --out "$out/zb-outside" --only "${ZB_ROWS:-zero-bubble-m8}" | grep -A3 '^| variant'
  pack zb-outside
}

part_2x2() {
  # Each copy trains on 16 of the 32 samples; PyTorch's stages are wrapped in DDP over the copies.
  timeout 540 python3 bench/bench.py w2 --bin "$bin" --ranks 2 --replicas 2 --dp "${FOUR_DP:-ddp}" --steps 6 \
    --micro-batches 4 --outside-steps 0 --only 'pytorch-1gpu,torch-pp-1f1b-m4-r2,1f1b-m4-r2,interleaved-m4-r2' \
    --timeout 130 --out "$out/four-2x2" --trace-dir "$out/four-2x2/timelines" | grep -A8 '^| variant'
  pack four-2x2
}

part_w1() {
  local b
  for b in 120 240 480; do  # pipelined runs with graphs: nccl_ctas 0 (the example's) becomes 2 under them
    timeout 180 python3 bench/bench.py w1 --bin "$bin" --global-batch "$b" --micro-batches 2,4,8 --graphs \
      --only "pytorch-1gpu-graph-b$b,torch-pp-1f1b-m4-b$b,conveyor-1dev-graphs-b$b,1f1b-m4-graphs-b$b,1f1b-m8-graphs-b$b" \
      --steps 10 --timeout 90 --out "$out/w1" --trace-dir "$out/w1/timelines" | grep -A8 '^| variant'
  done
}

part_window() {
  local k rows
  fashion_mnist
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
    job_line "$out/window/qs-k$k.json" "quickstart steps_in_flight $k" 64
  done
  pack window
}

run_parts best "$@"
