#!/usr/bin/env bash
# How does Conveyor on one GPU compare with PyTorch on one GPU? Single-device rows of W1 (ResNet50) and
# W2 (the GPT decoder), after bench/gpu/build.sh; needs one GPU (two stage servers want two).
#
#   bench/gpu/one-gpu.sh             the default, sizes: ms per step of the single-device variants, PyTorch's
#                                    best and Conveyor's, at W1's batch 120 and 60 and W2's 32, 8 and 4
#                                    sequences (bench.py sizes), then W1's operator profile at batch 120 by
#                                    family (bench/profile_summary.py), within SIZES_BUDGET (400) seconds;
#                                    what did not fit is named              $out/sizes/summary.md, w1/, w2/,
#                                                                           profiles/, profile-w1.md
#   bench/gpu/one-gpu.sh outside     W1 at batch 120: the single device, one stage server and two stages (two
#                                    steps in flight), 100 steps, every row the median of 3 runs, each Conveyor
#                                    row checked from outside with 20 s more of steps; about 500 s
#                                                                                        $out/outside.tgz
#   bench/gpu/one-gpu.sh one-stage   W2 on one stage server holding the whole model against the reference and
#                                    PyTorch, each Conveyor row checked from outside (20 s more)
#                                                                                      $out/w2-1stage.tgz
#   bench/gpu/one-gpu.sh clocks      W2 and W1 single-device rows, eager and captured, each Conveyor row
#                                    checked from outside                                    $out/clocks/
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"

part_sizes() {
  local d=$out/sizes start budget=${SIZES_BUDGET:-400} limit t f traces="" w
  mkdir -p "$d"
  start=$(date +%s)
  left() { echo $((budget - ($(date +%s) - start))); }
  summary() { echo "$*" >> "$d/summary.md"; }
  : > "$d/summary.md"
  nvidia-smi > "$d/nvidia-smi.txt" 2>&1
  python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))' \
    > "$d/torch-version.txt" 2>&1
  # W1 at 120 and 60 (torch.compile at 120 only), profiled; then W2 at 32, 8 and 4 with what is left (no
  # torch.compile, no CUDA-graph stage server: their minutes would not fit).
  limit=$(( $(left) > 190 ? 190 : $(left) ))
  timeout "$limit" python3 bench/bench.py sizes --w1 120,60 --w2 "" --bin "$bin" --out "$d/w1" --steps 8 \
    --full-only '*compile*' --timeout 100 --profile-dir "$d/profiles" > "$d/w1.log" 2>&1
  summary "W1 sizes: exit $? after $(( $(date +%s) - start )) s"
  if [ "$(left)" -gt 40 ]; then
    timeout "$(( $(left) - 20 ))" python3 bench/bench.py sizes --w1 "" --w2 32,8,4 --bin "$bin" --out "$d/w2" \
      --steps 6 --skip '*compile*,conveyor-1stage-graphs*' --timeout 90 --budget "$(( $(left) - 60 ))" \
      > "$d/w2.log" 2>&1
    summary "W2 sizes: exit $? after $(( $(date +%s) - start )) s"
  else
    summary "W2 sizes: left out (no time left)"
  fi
  # W1's operator profile at 120 by family. The first two side by side by kernel too: PyTorch and Conveyor
  # with the same settings (channels-last, cudnn.benchmark, eager); PyTorch's CUDA graph and Conveyor's
  # NCHW run in the family table only.
  for t in w1-pytorch-1gpu-cl-b120 w1-conveyor-1dev-b120/ w1-pytorch-1gpu-graph-b120 w1-conveyor-1dev-nchw-b120/; do
    f=$(find "$d/profiles" -path "*$t*" -name '*.json' 2> /dev/null | sort | head -1)
    [ -n "$f" ] && traces="$traces $f"
  done
  if [ -n "$traces" ]; then
    # shellcheck disable=SC2086
    python3 bench/profile_summary.py $traces --top 30 > "$d/profile-w1.md" 2>&1
    summary "profile: $traces"
  else
    summary "profile: no traces under $d/profiles"
  fi
  # The tables again from the CSVs, so that a part stopped at its limit still shows what it measured.
  for w in w1 w2; do
    [ -d "$d/$w" ] && { echo; python3 bench/bench.py sizes --tabulate --out "$d/$w" 2>&1 | tail -n +3; } >> "$d/summary.md"
  done
  [ -f "$d/profile-w1.md" ] && { echo; sed -n '/ms per operator family/,/^| total/p' "$d/profile-w1.md"; } >> "$d/summary.md"
  echo "total $(( $(date +%s) - start )) s" >> "$d/summary.md"
  cat "$d/summary.md"
}

part_outside() {
  # 100 steps inside and 20 s more outside: fewer steps and seconds left start-up effects and the start-up's
  # spread (seconds for two GPUs) too large to judge a row; each row the median of 3 runs (one two-GPU run
  # can be 8% off the others)
  timeout 560 python3 bench/bench.py w1 --bin "$bin" --global-batch 120 --micro-batches 4 --graphs --steps 100 \
    --repeats 3 --outside-seconds 20 --timeout 150 --out "$out/outside" \
    --only 'pytorch-1gpu-graph-b120,conveyor-1dev-b120,conveyor-1stage-graphs-b120,1f1b-m4-graphs-b120' \
    | grep -A8 "^| variant"
  pack outside
}

part_one_stage() {
  timeout 560 python3 bench/bench.py w2 --bin "$bin" --steps 10 --outside-seconds 20 --timeout 130 \
    --out "$out/w2-1stage" --only 'pytorch-1gpu,conveyor-1dev,conveyor-1stage' | grep -A6 '^| variant'
  pack w2-1stage
}

part_clocks() {
  timeout 300 python3 bench/bench.py w2 --bin "$bin" --steps 6 --timeout 130 --out "$out/clocks" \
    --only 'pytorch-1gpu,conveyor-1dev,conveyor-1dev-eager' | grep -A6 '^| variant'
  timeout 200 python3 bench/bench.py w1 --bin "$bin" --steps 10 --timeout 90 --out "$out/clocks" \
    --only 'pytorch-1gpu-cl,pytorch-1gpu-graph,conveyor-1dev,conveyor-1dev-eager' | grep -A7 '^| variant'
}

run_parts sizes "$@"
