#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ and runs each for
# RUNS executions (default 1,000,000), seeded with the example job files.
#   bench/fuzz/run.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-1000000}
build=${FUZZ_BUILD_DIR:-build-fuzz}
CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONVEYOR_FUZZ=ON \
  -DCMAKE_CXX_COMPILER_LAUNCHER= >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
mkdir -p "$corpus/job_file" "$corpus/tensor_frame" "$corpus/chunk_stream" "$corpus/sym_expr"
cp examples/*.yaml "$corpus/job_file/"
cp bench/fuzz/seeds/tensor_frame/* "$corpus/tensor_frame/"  # a valid activation and gradient
cp bench/fuzz/seeds/chunk_stream/* "$corpus/chunk_stream/"  # a whole frame in two chunks
# sizes as torch.export prints them, each after the byte that picks the symbols' value
# (PyTorch 2.11 writes sympy's srepr: the last two)
for e in "s0" "8*s0" "(s0//2)" "Mod(s0, 3)" "Max(1, s0 - 4)" "2*s0**2 + 1" "CeilDiv(s77, 2)" \
         "Symbol('s0', positive=True, integer=True)" "Add(Mul(Integer(-2), Symbol('s0')), Pow(Symbol('s0'), Integer(2)))"; do
  printf '\x05%s' "$e" > "$corpus/sym_expr/$(printf '%s' "$e" | md5sum | cut -c1-8)"
done
for target in job_file tensor_frame chunk_stream sym_expr; do
  start=$(date +%s)
  "$build/bin/fuzz_$target" -runs="$runs" -max_len=4096 -print_final_stats=1 "$corpus/$target" \
    > "$corpus/$target.log" 2>&1 || { tail -40 "$corpus/$target.log"; echo "fuzz_$target: FAILED"; exit 1; }
  echo "fuzz_$target: $(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' "$corpus/$target.log" | awk '{print $2}') executions, no crash ($(( $(date +%s) - start )) s)"
done
