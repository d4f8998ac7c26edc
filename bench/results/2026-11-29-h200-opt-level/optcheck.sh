#!/bin/bash
# -O1 against -O3 on one GPU: the Quick start's ConvNet folded onto one GPU (host-bound), and train --reference.
set -u
source .gpu/env.sh
dpkg -x .gpu/dataset-fashion-mnist_*.deb / 
nvidia-smi -L > $OUT/machine.txt
prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
for opt in O1 O3; do
  s=$(date +%s)
  cmake -S . -B build-$opt -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-$opt -DNDEBUG" \
    -DCONVEYOR_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH=$prefix > $OUT/cmake-$opt.log 2>&1 || { tail -20 $OUT/cmake-$opt.log; exit 1; }
  cmake --build build-$opt -j16 --target conveyor conveyor-torch stage_server coordinator > $OUT/build-$opt.log 2>&1 || { grep -E "error|FAILED" $OUT/build-$opt.log | head; exit 1; }
  echo "$opt built in $(( $(date +%s) - s )) s"
  grep -m1 -o "\-$opt -DNDEBUG" build-$opt/build.ninja
done
for i in 1 2 3; do
  for opt in O1 O3; do
    build-$opt/bin/conveyor local examples/fashion-convnet.yaml --set epochs=2 --curves "" > $OUT/local-$opt-$i.txt 2> $OUT/local-$opt-$i.err
    echo "local $opt run $i rc=$?: $(grep -E '^  final loss' $OUT/local-$opt-$i.txt)"
    build-$opt/bin/conveyor train examples/fashion-convnet.yaml --reference --set epochs=2 > $OUT/ref-$opt-$i.txt 2> $OUT/ref-$opt-$i.err
    echo "reference $opt run $i rc=$?: $(grep -E '^  final loss' $OUT/ref-$opt-$i.txt)"
  done
done
