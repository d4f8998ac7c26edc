#!/bin/bash
# Issue 19 on one GPU, in one call of under 7 minutes on an H100, after a
# build (build/bin exists): everything goes under $OUT.
#   1. the GPU tests (ctest -L gpu: out of memory as RESOURCE_EXHAUSTED,
#      channels-last with cuDNN autotuning and CUDA graphs, ...)  ctest-gpu.log
#   2. ms per step of the single-device variants, PyTorch's best and
#      Conveyor's, at W1's batch 120 and 60 and W2's 32, 8 and 4 sequences
#      (bench.py sizes)                          w1/sizes.md, w2/sizes.md, CSVs, logs
#   3. the operator profile by family of W1 at batch 120: PyTorch's
#      channels-last variant, Conveyor's single device (channels-last), PyTorch's
#      CUDA graph and Conveyor's NCHW run (bench/profile_summary.py)   profile-w1.md
# Each part runs under a time limit taken from what is left of 400 s; what
# did not fit is named in summary.md.
#   OUT=/tmp/out bench/gpu_issue19.sh        (B=build/bin, PYTHON=python3 by default)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/issue19-out}
B=${B:-build/bin}
PYTHON=${PYTHON:-python3}
BUDGET=${BUDGET:-400}
mkdir -p "$OUT"
START=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - START))); }
summary() { echo "$*" >> "$OUT/summary.md"; }
: > "$OUT/summary.md"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
"$PYTHON" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))' \
  > "$OUT/torch-version.txt" 2>&1

# 1. The GPU tests.
timeout 150 ctest --test-dir build -L gpu --output-on-failure > "$OUT/ctest-gpu.log" 2>&1
summary "ctest -L gpu: exit $? ($(grep -E 'tests passed|tests failed' "$OUT/ctest-gpu.log" | tail -1))"
grep -E '^\s*[0-9]+ - .*(Failed|Timeout|Not Run)' "$OUT/ctest-gpu.log" >> "$OUT/summary.md"

# 2. W1 at 120 and 60 (torch.compile at 120 only), profiled; then W2 at 32, 8
# and 4 with what is left (no torch.compile, no CUDA-graph stage server: their
# minutes would not fit).
W1_LIMIT=$(( $(left) > 190 ? 190 : $(left) ))
timeout "$W1_LIMIT" "$PYTHON" bench/bench.py sizes --w1 120,60 --w2 "" --bin "$B" --out "$OUT/w1" --steps 8 \
  --full-only '*compile*' --timeout 100 --profile-dir "$OUT/profiles" > "$OUT/w1.log" 2>&1
summary "W1 sizes: exit $? after $(( $(date +%s) - START )) s"
if [ "$(left)" -gt 40 ]; then
  timeout "$(( $(left) - 20 ))" "$PYTHON" bench/bench.py sizes --w1 "" --w2 32,8,4 --bin "$B" --out "$OUT/w2" \
    --steps 6 --skip '*compile*,conveyor-1stage-graphs*' --timeout 90 --budget "$(( $(left) - 60 ))" \
    > "$OUT/w2.log" 2>&1
  summary "W2 sizes: exit $? after $(( $(date +%s) - START )) s"
else
  summary "W2 sizes: left out (no time left)"
fi

# 3. The operator profile of W1 at 120 by family.
P="$OUT/profiles"
trace() { find "$P" -path "*$1*" -name '*.json' 2>/dev/null | sort | head -1; }
TRACES=""
# A and B, side by side by kernel too: PyTorch and Conveyor with the same settings (channels-last,
# cudnn.benchmark, eager); C and D in the family table only.
for t in w1-pytorch-1gpu-cl-b120 w1-conveyor-1dev-b120/ w1-pytorch-1gpu-graph-b120 w1-conveyor-1dev-nchw-b120/; do
  f=$(trace "$t")
  [ -n "$f" ] && TRACES="$TRACES $f"
done
if [ -n "$TRACES" ]; then
  # shellcheck disable=SC2086
  "$PYTHON" bench/profile_summary.py $TRACES --top 30 > "$OUT/profile-w1.md" 2>&1
  summary "profile: $TRACES"
else
  summary "profile: no traces under $P"
fi
# The tables again from the CSVs, so that a part stopped at its limit still shows what it measured.
for w in w1 w2; do
  [ -d "$OUT/$w" ] && { echo; "$PYTHON" bench/bench.py sizes --tabulate --out "$OUT/$w" 2>&1 | tail -n +3; } >> "$OUT/summary.md"
done
[ -f "$OUT/profile-w1.md" ] && { echo; sed -n '/ms per operator family/,/^| total/p' "$OUT/profile-w1.md"; } >> "$OUT/summary.md"
echo "total $(( $(date +%s) - START )) s" >> "$OUT/summary.md"
cat "$OUT/summary.md"
