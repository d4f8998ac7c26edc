#!/usr/bin/env bash
# On a GPU machine (see ../shared/gpu/README.md): builds against the PyTorch
# wheel's LibTorch, runs the GPU tests and the rest, then times W2 (GPT 1.34 B,
# bf16) as the single-device reference and as a 2-stage pipeline on the GPUs.
# Logs go to $OUT (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
build=${BUILD_DIR:-build-gpu}
nvidia-smi -L > "$out/machine.txt"
python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())' >> "$out/machine.txt"
if ! (time BUILD_DIR=$build scripts/build.sh) > "$out/build.log" 2>&1; then
  grep -E "error|FAILED" "$out/build.log" | head -30
  exit 1
fi
echo "built: $(tail -3 "$out/build.log" | tr '\n' ' ')"
# The GPU tests, and the equality suite's cases over NCCL and the gRPC stream
# between GPUs (they skip where there are fewer than two GPUs).
timeout 300 ctest --test-dir "$build" -R '^GpuTest\.|^Nccl/PipelineEquality' --output-on-failure \
  > "$out/ctest-gpu.log" 2>&1
echo "gpu tests: $(grep -E 'tests passed' "$out/ctest-gpu.log")"
grep -E "\*\*\*|max difference" "$out/ctest-gpu.log" | head -20
if [ "${SKIP_CPU_TESTS:-0}" != 1 ]; then
  timeout 300 ctest --test-dir "$build" -j16 -LE gpu --timeout 120 --output-on-failure > "$out/ctest-cpu.log" 2>&1
  echo "other tests: $(grep -E 'tests passed' "$out/ctest-cpu.log")"
  grep -E "\*\*\*" "$out/ctest-cpu.log" | head -20
fi
[ "${SKIP_W2:-0}" = 1 ] && exit 0
sed -e 's/^steps: .*/steps: 8/' examples/gpt-w2.yaml > "$out/w2.yaml"
timeout 200 "$build/bin/conveyor" train "$out/w2.yaml" --reference --device cuda:0 --json \
  > "$out/w2-reference.json" 2> "$out/w2-reference.log"
echo "w2 reference rc $?: $(tail -4 "$out/w2-reference.log" | tr '\n' ' ')"
timeout 240 "$build/bin/conveyor" local "$out/w2.yaml" --json --trace "$out/w2-trace" \
  > "$out/w2-local.json" 2> "$out/w2-local.log"
echo "w2 2-stage rc $?: $(tail -12 "$out/w2-local.log" | tr '\n' ' ')"
