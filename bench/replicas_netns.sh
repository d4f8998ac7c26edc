#!/usr/bin/env bash
# Replicas as if on two hosts, on the CPU (issue 32, item 4): two stage servers,
# each in a network namespace of its own with its own address on a bridge (as
# tests/integration/netns_test.cpp builds them), the coordinator in this one; a
# job with `replicas: 2` of one stage, whose gradients c10d's Gloo sums over the
# veth pairs. Prints the steady step time and, from the last step's timeline,
# how much of the step the all-reduce took and how much of it was left after the
# backward pass. Needs root (ip netns).
#
#   bench/replicas_netns.sh [JOB.yaml]     default: the Quick start's ConvNet on synthetic data as 2 x 1
#
# BIN (build/bin) and OUT (replicas-netns) may be set; OUT gets the job, the
# timeline (JSON and PNG) and the servers' logs.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build/bin}
out=${OUT:-replicas-netns}
mkdir -p "$out"
[ "$(id -u)" = 0 ] || { echo "needs root (ip netns)" >&2; exit 2; }
job=${1:-$out/job.yaml}
if [ $# -eq 0 ]; then
  cat > "$job" <<'EOF'
name: replicas-netns
model: {name: convnet, num_classes: 10}
data: {name: synthetic, train_samples: 4096, test_samples: 0}
partition: {stages: 1}
replicas: 2
batch_size: 256
micro_batches: 2
optimizer: {name: sgd, lr: 0.05, momentum: 0.9}
steps: 40
EOF
fi
tag=$$
bridge=cvr$tag
ns=(cvr$tag-0 cvr$tag-1)
veth=(cvr${tag}h0 cvr${tag}h1)
addr=(10.78.0.10 10.78.0.11)
pids=()
state=$(mktemp -d)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  for n in "${ns[@]}"; do ip netns del "$n" 2> /dev/null || true; done
  for v in "${veth[@]}"; do ip link del "$v" 2> /dev/null || true; done
  ip link del "$bridge" 2> /dev/null || true
  rm -rf "$state"
}
trap cleanup EXIT
ip link add "$bridge" type bridge
ip addr add 10.78.0.1/24 dev "$bridge"
ip link set "$bridge" up
for i in 0 1; do
  ip netns add "${ns[$i]}"
  ip link add "${veth[$i]}" type veth peer name eth0 netns "${ns[$i]}"
  ip link set "${veth[$i]}" master "$bridge"
  ip link set "${veth[$i]}" up
  ip -n "${ns[$i]}" addr add "${addr[$i]}/24" dev eth0
  ip -n "${ns[$i]}" link set eth0 up
  ip -n "${ns[$i]}" link set lo up
  ip netns exec "${ns[$i]}" "$bin/stage_server" --listen "${addr[$i]}:7000" --threads 1 \
    > "$out/stage-$i.log" 2>&1 &
  pids+=($!)
done
"$bin/coordinator" --listen 127.0.0.1:0 --port-file "$state/port" --state-dir "$state" \
  --stages "${addr[0]}:7000" "${addr[1]}:7000" > "$out/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$state/port" ] && break; sleep 0.1; done
coordinator=$(cat "$state/port")
"$bin/conveyor" health "$coordinator" --wait 30 > /dev/null
"$bin/conveyor" --coordinator "$coordinator" submit "$job" --wait --json > "$out/status.json"
id=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['job_id'])" "$out/status.json")
"$bin/conveyor" --coordinator "$coordinator" trace "$id" --out "$out/timeline" > /dev/null
python3 - "$out/status.json" "$out/timeline.json" <<'EOF'
import json, sys
status = json.load(open(sys.argv[1]))
trace = json.load(open(sys.argv[2]))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
spans = [e for e in events if e.get("ph") == "X"]
ms = 1000.0 * status["batch_size"] / status["steady_samples_per_second"]
print("steady step: %.2f ms (%d steps)" % (ms, status["steady_steps"]))
for tid in sorted({e.get("tid") for e in spans}):
    mine = [e for e in spans if e.get("tid") == tid]
    step = (max(e["ts"] + e["dur"] for e in mine) - min(e["ts"] for e in mine)) / 1000.0
    reduce = [e for e in mine if e["name"].startswith("A")]
    backward_end = max((e["ts"] + e["dur"] for e in mine if e["name"].startswith(("B", "W"))), default=0)
    covered = sum(e["dur"] for e in reduce) / 1000.0
    exposed = max(0.0, (max((e["ts"] + e["dur"] for e in reduce), default=0) - backward_end) / 1000.0)
    print("replica %s: last step %.2f ms, all-reduce spans %.2f ms (%d buckets, %.0f%% of the step), "
          "after the backward pass %.2f ms (%.0f%%)" % (tid, step, covered, len(reduce), 100 * covered / step,
                                                          exposed, 100 * exposed / step))
EOF
