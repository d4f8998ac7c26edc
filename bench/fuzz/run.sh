#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ and runs each for
# RUNS executions (default 1,000,000), from its seeds (bench/fuzz/seeds, the
# example job files) and its committed corpus (bench/fuzz/corpus: what earlier
# long runs found, minimized with -merge=1; docs/testing.md, "Fuzzing").
#   bench/fuzz/run.sh [RUNS [TARGET...]]     TARGET: job_file, torch_file, ... (default: all
#                                             but exported_program, which builds with LibTorch)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-1000000}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(job_file tensor_frame chunk_stream sym_expr torch_file pickle checkpoint http_request)
build=${FUZZ_BUILD_DIR:-build-fuzz}
# exported_program (a .pt2 archive) needs LibTorch: built only when named.
torch=OFF
for target in "${targets[@]}"; do [ "$target" = exported_program ] && torch=ON; done
CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONVEYOR_FUZZ=ON \
  -DCONVEYOR_FUZZ_TORCH=$torch -DCMAKE_CXX_COMPILER_LAUNCHER= >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
for target in "${targets[@]}"; do
  mkdir -p "$corpus/$target"
  for dir in bench/fuzz/seeds/$target bench/fuzz/corpus/$target; do
    [ -d "$dir" ] && cp "$dir"/* "$corpus/$target/"
  done
  # A corpus of near-copies of one file (exported_program's model.json
  # variants: 24 MB) is committed as an xz tarball (170 KB).
  [ -f "bench/fuzz/corpus/$target.tar.xz" ] && tar -C "$corpus/$target" -xJf "bench/fuzz/corpus/$target.tar.xz"
done
cp examples/*.yaml "$corpus/job_file/" 2>/dev/null || true
# sizes as torch.export prints them, each after the byte that picks the symbols' value
# (PyTorch 2.11 writes sympy's srepr: the last two)
if [ -d "$corpus/sym_expr" ]; then
  for e in "s0" "8*s0" "(s0//2)" "Mod(s0, 3)" "Max(1, s0 - 4)" "2*s0**2 + 1" "CeilDiv(s77, 2)" \
           "Symbol('s0', positive=True, integer=True)" "Add(Mul(Integer(-2), Symbol('s0')), Pow(Symbol('s0'), Integer(2)))"; do
    printf '\x05%s' "$e" > "$corpus/sym_expr/$(printf '%s' "$e" | md5sum | cut -c1-8)"
  done
fi
# A crash's, leak's or slow input's file goes to build-fuzz/artifacts, not
# into the work tree.
mkdir -p "$build/artifacts"
for target in "${targets[@]}"; do
  start=$(date +%s)
  max_len=4096
  [ "$target" = exported_program ] && max_len=131072  # a model.json is 8 to 91 KB
  "$build/bin/fuzz_$target" -runs="$runs" -max_len=$max_len -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$target-" "$corpus/$target" > "$corpus/$target.log" 2>&1 ||
    { tail -40 "$corpus/$target.log"; echo "fuzz_$target: FAILED (its input: $build/artifacts/)"; exit 1; }
  echo "fuzz_$target: $(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' "$corpus/$target.log" | awk '{print $2}') executions, no crash ($(( $(date +%s) - start )) s)"
done
