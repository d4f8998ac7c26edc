#!/usr/bin/env bash
# The Quick start: installs what is missing, builds, and trains the seed's
# ConvNet on Fashion-MNIST over 4 stage-server processes and a coordinator on
# this machine (GPUs where present), with live progress and a summary.
# Extra arguments go to `conveyor local` (e.g. --json, --device cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh run       # what building and running need, not the test suite's
scripts/build.sh programs  # conveyor, stage_server, coordinator
exec "${BUILD_DIR:-build}/bin/conveyor" local examples/fashion-convnet.yaml "$@"
