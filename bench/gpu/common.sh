# shellcheck shell=bash
# Sourced by every recipe in bench/gpu: the repository root as the working folder, results under $out,
# the GPU kit's environment (.gpu/env.sh, ../shared/gpu/README.md), the build's programs under $bin,
# and the helpers the recipes share. A recipe defines part_NAME functions and ends with
# `run_parts DEFAULT "$@"`: each argument names a part (dashes for underscores), none runs DEFAULT.
set -uo pipefail
recipe=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
out=${OUT:-gpu-out}
mkdir -p "$out"
command -v nvidia-smi > /dev/null && [ -f .gpu/env.sh ] && source .gpu/env.sh
export PYTHONUNBUFFERED=1
build=${BUILD_DIR:-build}
# shellcheck disable=SC2034  # read by the recipes that source this file
bin=$build/bin

# The recipe's header comment (from its second line to the first line that is not a comment), on stderr.
usage() {
  sed -n '2,/^[^#]/p' "$recipe" | sed '$d' | grep -v '^# shellcheck' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# How many GPUs the runs may use: CUDA_VISIBLE_DEVICES's list where it is set, else nvidia-smi's.
gpu_count() {
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .
  else
    nvidia-smi -L 2> /dev/null | wc -l
  fi
}

# Fashion-MNIST where the Quick start job reads it: unpacked from the package carried in .gpu/ if missing.
fashion_mnist() {
  ls /usr/share/datasets/fashion-mnist/*.gz > /dev/null 2>&1 || dpkg -x .gpu/dataset-fashion-mnist_*.deb /
}

# $out/NAME packed into $out/NAME.tgz (one file to bring back), the folder removed.
pack() {
  tar -czf "$out/$1.tgz" -C "$out" "$1" && rm -rf "${out:?}/$1"
}

# A GoogleTest log's verdict lines, on one line.
gtest_verdict() {
  grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$1" | tr '\n' ' '
}

# One line from a `conveyor ... --json` result: NAME, then each epoch's seconds, the steady ms per step at
# BATCH samples a step, the last epoch's mean loss and each stage's busy fraction.
job_line() {  # job_line RESULT.json NAME BATCH
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], 'epochs', [round(e['train_seconds'],2) for e in j['epochs']], 'steady ms/step', round(1000*int(sys.argv[3])/j['steady_samples_per_second'],3), 'loss', round(j['epochs'][-1]['mean_loss'],5), 'acc', j.get('eval_accuracy'), [round(s.get('busy_fraction',0),3) for s in j.get('stages',[])])" \
    "$1" "$2" "$3" 2>&1 | tail -1
}

# A server's port file's contents (HOST:PORT) once it is written; at most a minute.
wait_file() {  # wait_file FILE
  local _
  for _ in $(seq 600); do [ -s "$1" ] && { cat "$1"; return 0; }; sleep 0.1; done
  echo "$(basename "$recipe"): no $1 within a minute" >&2
  return 1
}

run_parts() {  # run_parts DEFAULT [PART...]
  local default=$1 part
  shift
  [ $# -eq 0 ] && set -- "$default"
  for part in "$@"; do
    declare -F "part_${part//-/_}" > /dev/null || usage
  done
  for part in "$@"; do
    "part_${part//-/_}"
  done
}
