#!/usr/bin/env bash
# Pipelines over slow links: the Quick start's job
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
# Settings (environment): JOB (examples/fashion-convnet.yaml; the CPU-sized
# decoder: bench/slow_links_decoder.yaml), BIN (build/bin), OUT (slow-links), STEPS (200),
# HOSTS ("2 4"), LINKS ("none 10gbit 1gbit"), SCHEDULES ("gpipe 1f1b
# interleaved zero-bubble"), MICRO_BATCHES ("4 8"), DELAY (0.2ms), THREADS
# (LibTorch threads per stage server, 1), MACHINE (a name for the CSV), SETS
# (more `--set KEY=VALUE` for every job, e.g. "--set partition.balance=time
# --set partition.link_gbps=1").
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

# The job: the Quick start's (or JOB), given in steps, without the evaluation.
sed -e '/^epochs:/d' -e '/^eval:/d' -e '/^steps:/d' "${JOB:-examples/fashion-convnet.yaml}" > "$out/job.yaml"
echo "steps: $steps" >> "$out/job.yaml"

source bench/netns_hosts.sh
pids=()
state=$(mktemp -d /tmp/conveyor-slow-links.XXXXXX)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  hosts_down
  rm -rf "$state"
}
trap cleanup EXIT
trap 'exit 130' INT  # the EXIT trap then removes the namespaces
trap 'exit 143' TERM
HOSTS_DELAY=$delay hosts_up "$max_hosts" "cvl$$"
ns=("${hosts_ns[@]}") addr=("${hosts_addr[@]}")
delay=$hosts_delay

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

# Runs the job on a coordinator; prints the steady step time in ms.
run_job() {  # COORDINATOR HOSTS SCHEDULE MICRO_BATCHES NAME
  local sets=(--set "partition.stages=$2" --set "schedule=$3" --set "micro_batches=$4") extra
  read -r -a extra <<< "${SETS:-}"
  sets+=("${extra[@]}")
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
job_name=$(basename "${JOB:-examples/fashion-convnet.yaml}" .yaml)
echo "date,machine,hosts,link,delay,schedule,micro_batches,steps,step_ms,loopback_ms,reference_ms,job" > "$csv"
for h in $hosts_list; do
  for s in $schedules; do
    for m in $mbs_list; do
      loop=$(run_job "$coordinator_loopback" "$h" "$s" "$m" "loopback-$h-$s-$m")
      echo "$h hosts, $s, $m micro-batches: loopback $loop ms" >&2
      for link in $links; do
        hosts_shape "$link"
        ms=$(run_job "$coordinator_hosts" "$h" "$s" "$m" "$link-$h-$s-$m")
        echo "$h hosts, $s, $m micro-batches: $link $ms ms" >&2
        echo "$date,$machine,$h,$link,$([ "$link" = none ] && echo 0 || echo "$delay"),$s,$m,$steps,$ms,$loop,$reference,$job_name" >> "$csv"
      done
    done
  done
done
hosts_shape none

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
