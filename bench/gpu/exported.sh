#!/usr/bin/env bash
# How does your exported model run here? Models from PyTorch 2 (torch.export) and TorchScript on the GPUs,
# after bench/gpu/build.sh; two GPUs. example needs Fashion-MNIST's package in the kit.
#
#   bench/gpu/exported.sh            the default, w2: W2's decoder exported (torch.export, batch dynamic)
#                                    against the zoo's gpt, one GPU and two stages, the exported rows checked
#                                    from outside (W2_OUTSIDE_STEPS, 150; W2_OUTSIDE_VARIANTS). W2_VARIANTS
#                                    picks some of bench/torchscript_w2.py's variants: the four together can
#                                    outlast a 10-minute call, so give each call W2_VARIANTS=zoo-gpt,exported-gpt
#                                    or zoo-gpt-2stage,exported-gpt-2stage (exported-gpt-unfused: the exported
#                                    one without its head split run as one)       $out/exported-w2.csv, .tgz
#   bench/gpu/exported.sh example    examples/your-model's exported path as its docs give it: export_model.py,
#                                    `conveyor local` over the GPUs, load_back.py --exported  $out/example.tgz
#   bench/gpu/exported.sh fixture    tests/fixtures/pt2/export_dynamic.py exports gpt_dyn.pt2 with this
#                                    machine's PyTorch 2 (the committed fixture is 2.11's), then the exported
#                                    programs' GPU test (live PyTorch 2 against Conveyor)      $out/pt2.tgz
#   bench/gpu/exported.sh torchscript  W2's decoder as TorchScript over 2 stages against the zoo's gpt
#                                                                                       $out/torchscript/
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"

part_w2() {
  # Not the zoo's rows checked from outside by default: its start-up (seeding 1.3 B weights on the CPU, 23 to
  # 45 s) varies by 1.5 to 7 s from run to run, too much for a check this short.
  timeout 560 python3 bench/torchscript_w2.py --bin "$bin" --out "$out/exported-w2" --steps 6 \
    --outside-steps "${W2_OUTSIDE_STEPS:-150}" --outside-variants "${W2_OUTSIDE_VARIANTS:-exported-gpt,exported-gpt-2stage}" \
    --variants "${W2_VARIANTS:-zoo-gpt,exported-gpt,zoo-gpt-2stage,exported-gpt-2stage}" | grep -vE '^epoch' | tail -15
  cp "$out/exported-w2/torchscript-w2.csv" "$out/exported-w2.csv" 2> /dev/null
  rm -f "$out"/exported-w2/*.pt "$out"/exported-w2/*.pt2 "$out"/exported-w2/tokens.bin
  pack exported-w2
}

part_example() {
  local ex
  fashion_mnist
  mkdir -p "$out/example" && ex=$(mktemp -d)
  { timeout 120 python3 examples/your-model/export_model.py "$ex" &&
    /usr/bin/time -f "conveyor local: %e s wall" timeout 180 "$bin/conveyor" local "$ex/job.yaml" --json \
      > "$out/example/result.json" &&
    timeout 60 python3 examples/your-model/load_back.py "$ex" --exported; } > "$out/example/example.log" 2>&1
  echo "example: exit $?; $(grep -E '^wrote|wall|test accuracy|rror' "$out/example/example.log" | tr '\n' ' ')"
  rm -rf "$ex"
  pack example
}

part_fixture() {
  mkdir -p "$out/pt2"
  timeout 120 python3 tests/fixtures/pt2/export_dynamic.py "$out/pt2" > "$out/pt2/export.log" 2>&1
  echo "export_dynamic.py: exit $?; $(grep -E '^exported with|refused|ran, out|train\(\)' "$out/pt2/export.log" | tr '\n' ' ')"
  timeout 300 "$bin/gpu_test" --gtest_filter='*Exported*' > "$out/pt2/gpu-exported.log" 2>&1
  echo "gpu_test *Exported*: $(gtest_verdict "$out/pt2/gpu-exported.log")"
  pack pt2
}

part_torchscript() {
  timeout 400 python3 bench/torchscript_w2.py --bin "$bin" --out "$out/torchscript" \
    --variants zoo-gpt-2stage,torchscript-gpt-2stage --steps 6 | grep -vE '^epoch' | tail -15
}

run_parts w2 "$@"
