#!/usr/bin/env bash
# Pipelines over slow links (issue 55, item 2): the Quick start's job
# (examples/fashion-convnet.yaml: the ConvNet on Fashion-MNIST, batch 64, Adam;
# STEPS steps, no evaluation) with its stages on 2 and 4 "hosts": stage
# servers each in a network and UTS namespace of its own, a veth pair each into
# a bridge, every host's outgoing link shaped with tc (netem's 0.2 ms delay over
# tbf at 10 or 1 Gbit/s, or left unshaped), for each schedule and micro-batch
# count. The same jobs with the servers on loopback in this namespace, and
# `conveyor train --reference` (one process, the whole batch), are the
# baselines. Writes OUT/slow_links.csv and prints a Markdown table of the
# steady step times (ms). A program, not a test: it asserts nothing. Needs root
# (ip netns, tc); run it under `nice` on a shared machine.
#
#   nice bench/slow_links.sh
#
# Settings (environment): BIN (build/bin), OUT (slow-links), STEPS (200),
# HOSTS ("2 4"), LINKS ("none 10gbit 1gbit"), SCHEDULES ("gpipe 1f1b
# interleaved zero-bubble"), MICRO_BATCHES ("4 8"), DELAY (0.2ms), THREADS
# (LibTorch threads per stage server, 1), MACHINE (a name for the CSV).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${BIN:-build/bin}" && pwd)
out=${OUT:-slow-links}
steps=${STEPS:-200}
hosts_list=${HOSTS:-2 4}
links=${LINKS:-none 10gbit 1gbit}
schedules=${SCHEDULES:-gpipe 1f1b interleaved zero-bubble}
mbs_list=${MICRO_BATCHES:-4 8}
delay=${DELAY:-0.2ms}
threads=${THREADS:-1}
machine=${MACHINE:-$(nproc)-core $(uname -m) $(hostname -s)}
[ "$(id -u)" = 0 ] || { echo "slow_links.sh: needs root (ip netns, tc)" >&2; exit 2; }
for p in ip tc nsenter unshare; do command -v "$p" > /dev/null || { echo "slow_links.sh: no $p" >&2; exit 2; }; done
mkdir -p "$out"
out=$(cd "$out" && pwd)
max_hosts=0
for h in $hosts_list; do [ "$h" -gt "$max_hosts" ] && max_hosts=$h; done

# The job: the Quick start's, given in steps, without the evaluation.
sed -e '/^epochs:/d' -e '/^eval:/d' examples/fashion-convnet.yaml > "$out/job.yaml"
echo "steps: $steps" >> "$out/job.yaml"

tag=$$
bridge=cvl$tag
ns=() veth=() addr=()
pids=()
state=$(mktemp -d /tmp/conveyor-slow-links.XXXXXX)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  for n in "${ns[@]}"; do ip netns del "$n" 2> /dev/null || true; done
  for v in "${veth[@]}"; do ip link del "$v" 2> /dev/null || true; done
  ip link del "$bridge" 2> /dev/null || true
  rm -rf "$state"
}
trap cleanup EXIT
trap 'exit 130' INT  # the EXIT trap then removes the namespaces
trap 'exit 143' TERM

# A /24 of 10.79 that no interface here uses.
net=
for n in $(seq 0 255); do ip -o -4 addr | grep -q " 10\.79\.$n\." || { net=10.79.$n; break; }; done
[ -n "$net" ] || { echo "slow_links.sh: every 10.79.N.0/24 is in use" >&2; exit 1; }
ip link add "$bridge" type bridge
ip addr add "$net.1/24" dev "$bridge"
ip link set "$bridge" up
for ((i = 0; i < max_hosts; i++)); do
  ns+=("cvl$tag-$i") veth+=("cvl${tag}v$i") addr+=("$net.$((11 + i))")
  ip netns add "${ns[i]}"
  ip link add "${veth[i]}" type veth peer name eth0 netns "${ns[i]}"
  ip link set "${veth[i]}" master "$bridge"
  ip link set "${veth[i]}" up
  ip -n "${ns[i]}" addr add "${addr[i]}/24" dev eth0
  ip -n "${ns[i]}" link set eth0 up
  ip -n "${ns[i]}" link set lo up
done

# Waits for a server's port file; prints HOST:PORT.
wait_port() {
  for _ in $(seq 600); do [ -s "$1" ] && { cat "$1"; return; }; sleep 0.1; done
  echo "slow_links.sh: no $1 within 60 s" >&2; exit 1
}
# The hosts' stage servers (one per namespace) and the loopback ones, each set
# with a coordinator of its own in this namespace. A 2-stage job takes the
# first two servers of its coordinator's list.
remote=() local_=()
for ((i = 0; i < max_hosts; i++)); do
  nsenter --net="/run/netns/${ns[i]}" unshare --uts bash -c 'hostname "$0" && exec "$@"' "host$i" \
    "$bin/stage_server" --listen "${addr[i]}:0" --port-file "$state/remote-$i.port" --threads "$threads" \
    > "$out/stage-host$i.log" 2>&1 &
  pids+=($!)
  "$bin/stage_server" --listen 127.0.0.1:0 --port-file "$state/local-$i.port" --threads "$threads" \
    > "$out/stage-local$i.log" 2>&1 &
  pids+=($!)
done
for ((i = 0; i < max_hosts; i++)); do
  remote+=("$(wait_port "$state/remote-$i.port")")
  local_+=("$(wait_port "$state/local-$i.port")")
done
mkdir -p "$state/remote" "$state/local"
"$bin/coordinator" --listen 127.0.0.1:0 --port-file "$state/remote.port" --state-dir "$state/remote" \
  --stages "$(IFS=,; echo "${remote[*]}")" > "$out/coordinator-hosts.log" 2>&1 &
pids+=($!)
"$bin/coordinator" --listen 127.0.0.1:0 --port-file "$state/local.port" --state-dir "$state/local" \
  --stages "$(IFS=,; echo "${local_[*]}")" > "$out/coordinator-loopback.log" 2>&1 &
pids+=($!)
coordinator_hosts=$(wait_port "$state/remote.port")
coordinator_loopback=$(wait_port "$state/local.port")

# netem (the delay) is a module some kernels lack (a Firecracker VM's 6.18
# has tbf but no sch_netem): then the links get their rate alone, and the CSV
# says so (delay 0).
if ! tc -n "${ns[0]}" qdisc add dev lo root netem delay "$delay" 2> /dev/null; then
  echo "slow_links.sh: this kernel has no netem qdisc: links shaped by rate only, no added delay" >&2
  delay=0
fi
tc -n "${ns[0]}" qdisc del dev lo root 2> /dev/null || true
# Shapes every host's outgoing link: netem's delay with tbf at the rate under
# it (a burst of 2 ms at that rate, at least 64 KB: a GSO packet), or nothing.
shape() {
  local link=$1 i rate_bits burst parent=root
  for ((i = 0; i < max_hosts; i++)); do
    tc -n "${ns[i]}" qdisc del dev eth0 root 2> /dev/null || true
    [ "$link" = none ] && continue
    rate_bits=$(( ${link%gbit} * 1000000000 ))
    burst=$(( rate_bits / 8 / 500 )); [ "$burst" -ge 65536 ] || burst=65536
    if [ "$delay" != 0 ]; then
      tc -n "${ns[i]}" qdisc add dev eth0 root handle 1: netem delay "$delay" limit 100000
      parent="parent 1:1"
    fi
    tc -n "${ns[i]}" qdisc add dev eth0 $parent handle 10: tbf rate "$link" burst "$burst" latency 50ms
  done
}
# Runs the job on a coordinator; prints the steady step time in ms.
run_job() {  # COORDINATOR HOSTS SCHEDULE MICRO_BATCHES NAME
  local sets=(--set "partition.stages=$2" --set "schedule=$3" --set "micro_batches=$4")
  [ "$3" = interleaved ] && sets+=(--set virtual_stages=2)
  "$bin/conveyor" --coordinator "$1" submit "$out/job.yaml" "${sets[@]}" --wait --json > "$out/$5.json" \
    2> "$out/$5.log" || { echo "nan"; return; }
  python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))
print("%.1f" % (1000.0 * s["batch_size"] / s["steady_samples_per_second"]))' "$out/$5.json"
}

date=$(date -u +%Y-%m-%d)
reference=$("$bin/conveyor" train "$out/job.yaml" --reference --device cpu --threads "$threads" --json \
  2> "$out/reference.log" > "$out/reference.json" &&
  python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))
print("%.1f" % (1000.0 * s["batch_size"] / s["steady_samples_per_second"]))' "$out/reference.json")
echo "reference (one process, $threads thread(s)): $reference ms a step" >&2
csv=$out/slow_links.csv
echo "date,machine,hosts,link,delay,schedule,micro_batches,steps,step_ms,loopback_ms,reference_ms" > "$csv"
for h in $hosts_list; do
  for s in $schedules; do
    for m in $mbs_list; do
      loop=$(run_job "$coordinator_loopback" "$h" "$s" "$m" "loopback-$h-$s-$m")
      echo "$h hosts, $s, $m micro-batches: loopback $loop ms" >&2
      for link in $links; do
        shape "$link"
        ms=$(run_job "$coordinator_hosts" "$h" "$s" "$m" "$link-$h-$s-$m")
        echo "$h hosts, $s, $m micro-batches: $link $ms ms" >&2
        echo "$date,$machine,$h,$link,$([ "$link" = none ] && echo 0 || echo "$delay"),$s,$m,$steps,$ms,$loop,$reference" >> "$csv"
      done
    done
  done
done
shape none

# The table: one row per (hosts, schedule, micro-batches), a column per link.
python3 - "$csv" "$links" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
links = sys.argv[2].split()
names = {"none": "veth, unshaped", "10gbit": "10 Gbit/s", "1gbit": "1 Gbit/s"}
print("| hosts | schedule | micro-batches | loopback | " + " | ".join(names.get(l, l) for l in links) + " |")
print("| ---: | --- | ---: | ---: | " + " | ".join("---:" for _ in links) + " |")
keys = []
for r in rows:
    k = (r["hosts"], r["schedule"], r["micro_batches"])
    if k not in keys: keys.append(k)
for k in keys:
    mine = {r["link"]: r for r in rows if (r["hosts"], r["schedule"], r["micro_batches"]) == k}
    first = next(iter(mine.values()))
    print("| %s | %s | %s | %s | %s |" % (k[0], k[1], k[2], first["loopback_ms"],
          " | ".join(mine[l]["step_ms"] if l in mine else "" for l in links)))
print("\nreference (`conveyor train --reference`): %s ms a step" % rows[0]["reference_ms"])
EOF
