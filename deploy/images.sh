#!/usr/bin/env bash
# Builds Conveyor's container images with podman, from a Debian base made with
# debootstrap (no image registry needed: only Debian's package mirror).
#
#   deploy/images.sh [--bin DIR] [--tag TAG] PART...
#
#   base        debootstrap --variant=minbase bookworm, imported as conveyor-base:TAG
#   cpu         conveyor:TAG, the CPU runtime image (deploy/Dockerfile.binaries) from
#               the binaries in DIR (default build/bin; scripts/build.sh makes them on a
#               bookworm host), on conveyor-base:TAG
#   prometheus  conveyor-prometheus:TAG, Prometheus from Debian's package
#               (deploy/Dockerfile.prometheus), on conveyor-base:TAG
#   compile     conveyor:TAG from deploy/Dockerfile: the programs compiled in the
#               image's build stage (slow: about 8 minutes on 2 cores), on conveyor-base:TAG
#
# TAG defaults to latest. Each part prints its time and the image's size.
# scripts/setup.sh installs podman, runc and debootstrap; CONTAINERS_CONF
# defaults to deploy/podman/containers.conf (hosts without systemd). The GPU
# image (deploy/Dockerfile.cuda) needs a PyTorch CUDA base image: see
# docs/operations.md, "Images".
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
bin=$src/build/bin tag=latest
parts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$(cd "$2" && pwd); shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    base|cpu|prometheus|compile) parts+=("$1"); shift ;;
    *) sed -n '2,20p' "$0" >&2; exit 2 ;;
  esac
done
[ ${#parts[@]} -gt 0 ] || { sed -n '2,20p' "$0" >&2; exit 2; }
export CONTAINERS_CONF=${CONTAINERS_CONF:-$src/deploy/podman/containers.conf}
mirror=${CONVEYOR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=localhost/conveyor-base:$tag

tmp=$(mktemp -d -t conveyor-images.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

report() {  # IMAGE START
  local size
  size=$(podman image inspect --format '{{.Size}}' "$1")
  echo "images: $1 built in $(( $(date +%s) - $2 )) s, $(( size / 1000000 )) MB"
}

# The host's downloaded packages, seen by apt in the build through an overlay
# (what the build adds or removes there stays out of the host's folder): a
# bookworm host that built Conveyor holds most of the runtime image's, which
# then need no download (the CPU image: 134 s -> 92 s on the 2-core machine, 2026-11-28).
apt_cache=()
[ -d /var/cache/apt/archives ] && apt_cache=(--volume /var/cache/apt/archives:/var/cache/apt/archives:O)
build() {  # IMAGE DOCKERFILE CONTEXT: its log's tail on failure
  local log=$tmp/build-$(basename "$2").log
  podman build --network host --layers=false "${apt_cache[@]}" --build-arg "BASE=$base" -t "$1" -f "$2" "$3" > "$log" 2>&1 ||
    { tail -30 "$log" >&2; exit 1; }
}

for part in "${parts[@]}"; do
  start=$(date +%s)
  case "$part" in
    base)
      debootstrap_cache=()
      [ -d /var/cache/apt/archives ] && debootstrap_cache=(--cache-dir=/var/cache/apt/archives)
      debootstrap --variant=minbase "${debootstrap_cache[@]}" bookworm "$tmp/rootfs" "$mirror" > "$tmp/debootstrap.log" 2>&1 ||
        { tail -20 "$tmp/debootstrap.log" >&2; exit 1; }
      # As Debian's own images: no apt lists or package files kept in a layer.
      rm -rf "$tmp/rootfs/var/lib/apt/lists/"* "$tmp/rootfs/var/cache/apt/archives/"*.deb
      cat > "$tmp/rootfs/etc/apt/apt.conf.d/docker-clean" <<'CONF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CONF
      tar -C "$tmp/rootfs" -c . | podman import --quiet --message "debootstrap --variant=minbase bookworm" - "$base" > /dev/null
      rm -rf "$tmp/rootfs"
      report "$base" "$start" ;;
    cpu)
      for p in stage_server coordinator conveyor conveyor-torch; do
        [ -x "$bin/$p" ] || { echo "images: no $bin/$p (run scripts/build.sh first)" >&2; exit 1; }
      done
      mkdir -p "$tmp/cpu/bin"
      cp "$bin/stage_server" "$bin/coordinator" "$bin/conveyor" "$bin/conveyor-torch" "$tmp/cpu/bin/"
      cp -r "$src/examples" "$tmp/cpu/examples"
      "$src/scripts/runtime-packages.sh" "$bin/stage_server" "$bin/coordinator" "$bin/conveyor" > "$tmp/cpu/runtime-packages.txt"
      build "localhost/conveyor:$tag" "$src/deploy/Dockerfile.binaries" "$tmp/cpu"
      rm -rf "$tmp/cpu"
      report "localhost/conveyor:$tag" "$start" ;;
    prometheus)
      mkdir -p "$tmp/prometheus"
      build "localhost/conveyor-prometheus:$tag" "$src/deploy/Dockerfile.prometheus" "$tmp/prometheus"
      report "localhost/conveyor-prometheus:$tag" "$start" ;;
    compile)
      podman build --network host --build-arg "BASE=$base" --build-arg "RUNTIME_BASE=$base" \
        -t "localhost/conveyor:$tag" -f "$src/deploy/Dockerfile" "$src"
      report "localhost/conveyor:$tag" "$start" ;;
  esac
done
