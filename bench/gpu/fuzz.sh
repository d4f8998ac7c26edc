#!/usr/bin/env bash
# How long does the .pt2 reader hold up under fuzzing? bench/fuzz's fuzz_exported_program on the GPU
# machine's CPU cores (16, where the CPU machine has 2): clang 14 and its sanitizer runtimes from
# Debian's packages, LibTorch from the machine's PyTorch wheel. The kit, .gpu-fuzz, is made here on a
# Debian bookworm host that has .gpu (../shared/gpu); what travels is capped at 64 MiB, so it holds
# the packages of .gpu that the fuzz build needs (not GoogleTest, prometheus-cpp, civetweb or curl)
# beside clang's: carry .gpu-fuzz alone. About 2 million executions in 8 minutes on that machine.
#
#   bench/gpu/fuzz.sh kit     here: .gpu-fuzz (about 53 MB; apt-get download and gcc)
#   bench/gpu/fuzz.sh run     there, the default: build (40 s), then fuzz for FUZZ_SECONDS (480) with
#                             -fork=15 from the seeds and the committed corpus
#                             $out/fuzz.log.gz, $out/corpus.tar.gz (its corpus at the end: merge it
#                             into bench/fuzz/corpus/exported_program.tar.xz, docs/testing.md),
#                             $out/artifacts.tar.gz (an input that crashed it, if one did)
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"

kit=.gpu-fuzz
llvm=usr/lib/llvm-14
rt=$llvm/lib/clang/14.0.6

part_kit() {
  [ -d .gpu/debs ] || { echo "fuzz.sh kit: no .gpu/debs (bench/gpu/README.md, Carrying the kit)" >&2; exit 1; }
  rm -rf "$kit" && mkdir -p "$kit/debs" "$kit/clang" "$kit/stubs"
  cp .gpu/env.sh "$kit/"
  local deb
  for deb in .gpu/debs/*.deb; do
    case $(basename "$deb") in civetweb*|libcivetweb*|libcurl4*|libgmock*|libgtest*|libprometheus*|prometheus-cpp*) ;;
      *) cp "$deb" "$kit/debs/" ;; esac
  done
  (cd "$kit/clang" && apt-get download clang-14 libclang-cpp14 libllvm14 libclang-common-14-dev libclang-rt-14-dev) ||
    exit 1
  # Of the sanitizers' runtimes, the x86-64 ones that ASan, UBSan and libFuzzer link, and their headers.
  local tmp
  tmp=$(mktemp -d)
  dpkg -x "$kit"/clang/libclang-rt-14-dev_*.deb "$tmp/all"
  mkdir -p "$tmp/rt/$rt/lib/linux"
  cp -r "$tmp/all/$rt/include" "$tmp/rt/$rt/"
  cp "$tmp/all/$rt"/lib/linux/libclang_rt.{asan-preinit,asan,asan_cxx,asan_static,fuzzer,fuzzer_no_main,ubsan_standalone,ubsan_standalone_cxx}-x86_64.a* \
    "$tmp/rt/$rt/lib/linux/"
  tar -C "$tmp/rt" -cJf "$kit/clang/clang-rt-x86_64.tar.xz" . && rm "$kit"/clang/libclang-rt-14-dev_*.deb
  # libLLVM-14 needs libz3 (the static analyzer's solver, which compiling does not call) and libedit,
  # which that machine lacks: stubs of the functions it names, each aborting.
  dpkg -x "$kit"/clang/libllvm14_*.deb "$tmp/llvm"
  nm -D --undefined-only "$tmp/llvm/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1" | awk '{print $2}' | sed 's/@.*//' |
    sort -u > "$tmp/undefined"
  stub "$tmp" libz3.so.4 '^Z3_'
  stub "$tmp" libedit.so.2 '^(el_|history)'
  rm -rf "$tmp"
  du -sh "$kit"
}

stub() {  # stub TMP SONAME PATTERN: a library of the functions libLLVM needs that match PATTERN
  { echo '#include <stdlib.h>'; grep -E "$3" "$1/undefined" | sed 's/.*/void &(void) { abort(); }/'; } > "$1/$2.c"
  gcc -shared -fPIC -o "$kit/stubs/$2" -Wl,-soname,"$2" "$1/$2.c"
}

part_run() {
  [ -f "$kit/env.sh" ] || { echo "fuzz.sh: no $kit (bench/gpu/fuzz.sh kit, here, then carry it)" >&2; exit 1; }
  source "$kit/env.sh"
  local clang=/opt/clang so
  if [ ! -f "$clang/$rt/include/sanitizer/asan_interface.h" ]; then
    mkdir -p "$clang/stubs"
    for deb in "$kit"/clang/*.deb; do dpkg -x "$deb" "$clang"; done
    tar -C "$clang" -xJf "$kit/clang/clang-rt-x86_64.tar.xz"
    for so in libz3.so.4 libedit.so.2; do
      ldconfig -p | grep -q "^\s*$so " || cp "$kit/stubs/$so" "$clang/stubs/"
    done
  fi
  export PATH=$clang/$llvm/bin:$PATH
  export LD_LIBRARY_PATH=$clang/usr/lib/x86_64-linux-gnu:$clang/$llvm/lib:$clang/stubs:$LD_LIBRARY_PATH
  local dir=build-fuzz-gpu t0
  t0=$(date +%s)
  if [ ! -f "$dir/build.ninja" ]; then
    rm -rf "$dir"
    CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONVEYOR_FUZZ=ON \
      -DCONVEYOR_FUZZ_TORCH=ON -DCMAKE_CXX_COMPILER_LAUNCHER= > "$out/configure.log" 2>&1 ||
      { tail -30 "$out/configure.log"; exit 1; }
  fi
  cmake --build "$dir" -j"$(nproc)" --target fuzz_exported_program > "$out/build.log" 2>&1 ||
    { grep -m5 -A5 error "$out/build.log"; exit 1; }
  echo "fuzz_exported_program built in $(( $(date +%s) - t0 )) s"
  local corpus=/tmp/fuzz-corpus artifacts=/tmp/fuzz-artifacts
  rm -rf "$artifacts" && mkdir -p "$corpus" "$artifacts"
  cp bench/fuzz/seeds/exported_program/* "$corpus/"
  tar -C "$corpus" -xJf bench/fuzz/corpus/exported_program.tar.xz
  "$dir/bin/fuzz_exported_program" -fork=$(( $(nproc) - 1 )) -max_total_time="${FUZZ_SECONDS:-480}" -max_len=131072 \
    -rss_limit_mb=8192 -artifact_prefix="$artifacts/" "$corpus" > "$out/fuzz.log" 2>&1
  echo "fuzz_exported_program exited $? (0: no finding); the last line of its log:"
  grep -E '^#[0-9]+:' "$out/fuzz.log" | tail -1
  tar -C "$corpus" -czf "$out/corpus.tar.gz" .
  if [ -n "$(ls "$artifacts")" ]; then
    ls "$artifacts"
    tar -C "$artifacts" -czf "$out/artifacts.tar.gz" .
  fi
  gzip -f9 "$out/fuzz.log"
}

run_parts run "$@"
