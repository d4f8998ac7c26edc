#!/usr/bin/env bash
# Installs what Conveyor needs, with apt (Debian bookworm):
#   scripts/setup.sh run    what building and running the programs need (the Quick start)
#   scripts/setup.sh        that and what the test suite needs (scripts/test.sh): GoogleTest,
#                           PyTorch for the oracle, Slurm, Prometheus, docker-compose with
#                           podman and debootstrap (the images), clang for the fuzzers,
#                           iproute2 for the network namespaces
#
# Where a pip-installed PyTorch is present (GPU machines, Ubuntu 24.04, which
# has no libtorch-dev), its LibTorch is used and libtorch-dev is not installed;
# CONVEYOR_TORCH=debian|pip forces the choice.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-test}
case "$what" in run|test) ;; *) echo "usage: scripts/setup.sh [run|test]" >&2; exit 2 ;; esac

packages=(
  cmake g++ ninja-build pkg-config ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libcli11-dev libyaml-cpp-dev nlohmann-json3-dev
  libsqlite3-dev libssl-dev openssl zlib1g-dev prometheus-cpp-dev
  # the Quick start's data, and the curves `conveyor local` draws
  dataset-fashion-mnist python3-matplotlib
)
torch=$(scripts/torch-source.sh)
if [ "$torch" = debian ]; then
  packages+=(libtorch-dev)
  # c10d's Gloo group (replicas: docs/parallelism.md) needs gloo's headers.
  packages+=(libgloo-dev)
fi
if [ "$what" = test ]; then
  packages+=(
    libgtest-dev libgmock-dev
    docker-compose clang-14 libclang-rt-14-dev iproute2
    # deploy/ tests: a real Slurm on loopback (ctest deploy.slurm), YAML for the
    # Kubernetes check (deploy.kubernetes; kubectl itself is not a Debian package)
    slurm-wlm munge python3-yaml prometheus
    # the images built and the compose cluster run (ctest deploy.containers)
    podman runc debootstrap netavark aardvark-dns catatonit iptables curl
  )
  # python3-torch: the user's side in the tests (PyTorch 1.13, the same as
  # libtorch-dev), the oracle that a Conveyor run must equal.
  if [ "$torch" = debian ]; then packages+=(python3-torch); fi
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
