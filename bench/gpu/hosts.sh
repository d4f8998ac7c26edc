#!/usr/bin/env bash
# How does the pipeline train when its GPUs sit on hosts of their own? Each stage server, and each
# rank of torch.distributed.pipelining, runs in a network namespace with its own hostname and an
# address on a bridge, its link shaped with tc's tbf to each of LINKS, and NCCL goes through
# sockets alone (no NVLink, shared memory or InfiniBand): what hosts joined by Ethernet have. W2 on
# two GPUs: Conveyor's zero-bubble over NCCL and over its gRPC data plane, and pipelining's ZB-V and
# 1F1B under the same link, with PyTorch eager on one GPU beside them. After bench/gpu/build.sh;
# needs root, and `ip` and `tc` (carried in .gpu/iproute2 where the machine has none). About 4 min.
#
#   bench/gpu/hosts.sh          the default: w2        $out/hosts.csv, and a table
#   bench/gpu/hosts.sh probe    NCCL send/recv of 256 MB between the hosts under each link
#
# Settings (environment): LINKS ("25gbit 100gbit"; `none`: the veth unshaped), ROWS (Conveyor's:
# "zero-bubble-4-nccl zero-bubble-4-grpc", SCHEDULE-MICROBATCHES-TRANSPORT), TORCH_ROWS ("zbv-4
# 1f1b-8", SCHEDULE-MICROBATCHES), STEPS (10, the first 2 not timed), OUTSIDE_STEPS (100; 0: none)
# and OUTSIDE_REPEATS (1): each Conveyor row's job run again at that length, its ms a step from
# outside the difference of the two lengths' shortest wall times (`conveyor submit --wait`, the
# job's start included in both) over the difference of their steps, beside the row's own clock (a
# short job on each data plane first, untimed: the first job on a fresh server pays for CUDA's and
# the transport's start, about 3 s, which no row should carry); NCCL_SOCKET_NTHREADS and
# NCCL_NSOCKS_PERTHREAD (4 and 4: one socket pair carries about 25 Gb/s).
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"
if [ -x .gpu/iproute2/ip ]; then
  export IP=$PWD/.gpu/iproute2/ip TC=$PWD/.gpu/iproute2/tc
  export LD_LIBRARY_PATH=$PWD/.gpu/iproute2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# shellcheck source=bench/netns_hosts.sh
source bench/netns_hosts.sh
links=${LINKS:-25gbit 100gbit}
steps=${STEPS:-10}
outside_steps=${OUTSIDE_STEPS:-100}
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=eth0
export NCCL_SOCKET_NTHREADS=${NCCL_SOCKET_NTHREADS:-4} NCCL_NSOCKS_PERTHREAD=${NCCL_NSOCKS_PERTHREAD:-4}
run=$(mktemp -d /tmp/conveyor-hosts.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null
  hosts_down
  rm -rf "$run"
}
trap cleanup EXIT
hosts_up 2 cvg || exit 1
namespaces=$(IFS=,; echo "${hosts_ns[*]}")

start_cluster() {  # a stage server in each namespace (GPU i), the coordinator here; sets $coordinator
  local i stages=()
  for i in 0 1; do
    nsenter --net="/run/netns/${hosts_ns[i]}" unshare --uts bash -c 'hostname "$0" && exec "$@"' "gpuhost$i" \
      "$bin/stage_server" --listen "${hosts_addr[i]}:0" --port-file "$run/stage$i.addr" --device "cuda:$i" \
      --checkpoint-dir "$run/stage$i" --log-level warn > "$out/hosts-stage$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1; do stages+=("$(wait_file "$run/stage$i.addr")") || return 1; done
  "$bin/coordinator" --listen 127.0.0.1:0 --port-file "$run/coordinator.addr" --state-dir "$run/state" \
    --stages "$(IFS=,; echo "${stages[*]}")" --log-level warn > "$out/hosts-coordinator.log" 2>&1 &
  pids+=($!)
  coordinator=$(wait_file "$run/coordinator.addr")
}

conveyor_run() {  # conveyor_run NAME STEPS LINK SCHEDULE MICROBATCHES TRANSPORT: "OWN_MS WALL_S", or "nan nan"
  local name=$1 n=$2 t0 t1
  python3 -c 'import sys; sys.path.insert(0, "bench"); from bench_workloads import job_text
print(job_text("w2", int(sys.argv[1]), schedule=sys.argv[2], micro_batches=int(sys.argv[3]),
               extra=["transport=" + sys.argv[4]]), end="")' "$n" "$4" "$5" "$6" > "$run/$name.yaml"
  t0=$(date +%s.%N)
  timeout 300 "$bin/conveyor" --coordinator "$coordinator" submit "$run/$name.yaml" --wait --json \
    > "$out/$name.json" 2> "$out/$name.log" || { echo nan nan; return; }
  t1=$(date +%s.%N)
  python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))
print("%.1f %.3f" % (1000.0 * s["batch_size"] / s["steady_samples_per_second"], float(sys.argv[3]) - float(sys.argv[2])))' \
    "$out/$name.json" "$t0" "$t1"
}

# conveyor_row LINK SCHEDULE MICROBATCHES TRANSPORT: "OWN_MS OUTSIDE_MS OUTSIDE/OWN" (nan where not run).
# With the outside check, OUTSIDE_REPEATS (1) runs of each length, alternated, long first after the
# row's own run; the walls and each run's own clock go to judge_outside (bench/bench_outside.py).
conveyor_row() {
  local name="w2-$1-$2-m$3-$4" own wall r runs=()
  read -r own wall <<< "$(conveyor_run "$name" "$steps" "$@")"
  if [ "$outside_steps" -le "$steps" ] || [ "$own" = nan ]; then
    echo "$own nan nan"
    return
  fi
  runs+=("$steps $own $wall")
  for r in $(seq "${OUTSIDE_REPEATS:-1}"); do
    runs+=("$outside_steps $(conveyor_run "$name-outside-$r" "$outside_steps" "$@")")
    [ "$r" -gt 1 ] && runs+=("$steps $(conveyor_run "$name-$r" "$steps" "$@")")
  done
  printf '%s\n' "${runs[@]}" >> "$out/hosts-outside.log"
  printf '%s\n' "${runs[@]}" | python3 -c 'import sys; sys.path.insert(0, "bench"); from bench_outside import judge_outside
walls, clocks = {}, {}
for line in sys.stdin:
    n, ms, wall = line.split()
    if wall != "nan":
        walls.setdefault(int(n), []).append(float(wall))
        clocks.setdefault(int(n), []).append(float(ms))
own = float(sys.argv[1])
ms, ratio, notes = judge_outside(own, walls, clocks=clocks)
print("%.1f %.1f %.3f" % (own, ms, ratio))
for note in notes: print(note, file=sys.stderr)' "$own" 2>> "$out/hosts-outside.log" || echo "$own nan nan"
}

torch_row() {  # torch_row SCHEDULE MICROBATCHES|"" [--netns ...]: ms a step, or nan
  local schedule=$1 m=$2
  shift 2
  timeout 150 python3 bench/torch_pipelining.py w2 --schedules "$schedule" ${m:+--micro-batches "$m"} --steps $((steps - 2)) \
    --warmup 2 --ranks 2 --timeout 130 "$@" 2>> "$out/hosts-torch.log" |
    python3 -c 'import json, sys
ms = [json.loads(l).get("ms_per_iter") for l in sys.stdin if l.startswith("{")]
print("%.1f" % ms[0] if ms and ms[0] else "nan")'
}

part_probe() {
  local link
  for link in $links; do
    hosts_shape "$link"
    echo "$link: $(timeout 120 python3 bench/gpu/link_probe.py "$namespaces" "${hosts_addr[0]}" 2>> "$out/hosts-probe.log")"
  done
}

split_row() {  # split_row SCHEDULE-MICROBATCHES-TRANSPORT: sets the caller's s, m and t
  t=${1##*-} s=${1%-*}
  m=${s##*-} s=${s%-*}
}

part_w2() {
  local link row s m t eager ms outside ratio csv=$out/hosts.csv
  start_cluster || { cat "$out"/hosts-*.log; return 1; }
  eager=$(torch_row single "")
  for row in ${ROWS:-zero-bubble-4-nccl zero-bubble-4-grpc}; do
    split_row "$row"
    conveyor_run "warm-up-$t" 3 none "$s" "$m" "$t" > /dev/null
  done
  echo "date,cards,link,system,schedule,micro_batches,transport,ms,eager_ms,outside_ms,outside_ratio" > "$csv"
  for link in $links; do
    hosts_shape "$link"
    echo "$link: NCCL send/recv $(timeout 120 python3 bench/gpu/link_probe.py "$namespaces" "${hosts_addr[0]}" 2>> "$out/hosts-probe.log")"
    for row in ${ROWS:-zero-bubble-4-nccl zero-bubble-4-grpc}; do
      split_row "$row"
      read -r ms outside ratio <<< "$(conveyor_row "$link" "$s" "$m" "$t")"
      echo "$(date -u +%F),$(cards),$link,conveyor,$s,$m,$t,$ms,$eager,$outside,$ratio" >> "$csv"
      tail -1 "$csv"
    done
    for row in ${TORCH_ROWS:-zbv-4 1f1b-8}; do
      s=${row%-*} m=${row##*-}
      echo "$(date -u +%F),$(cards),$link,torch-pp,$s,$m,nccl,$(torch_row "$s" "$m" --netns "$namespaces@${hosts_addr[0]}"),$eager,," >> "$csv"
      tail -1 "$csv"
    done
  done
  python3 - "$csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("\nW2 on %s, each GPU a host, NCCL through sockets; PyTorch eager on one GPU: %s ms" % (rows[0]["cards"], rows[0]["eager_ms"]))
print("| link | system | schedule | micro-batches | transport | ms a step | x eager | x pipelining's best | outside ms a step | outside / own |")
print("| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
for link in dict.fromkeys(r["link"] for r in rows):
    mine = [r for r in rows if r["link"] == link]
    pp = [float(r["ms"]) for r in mine if r["system"] == "torch-pp" and r["ms"] != "nan"]
    best = min(pp) if pp else float("nan")
    for r in mine:
        ms = float(r["ms"])
        print("| %s | %s | %s | %s | %s | %.1f | %.2f | %.3f | %s | %s |" % (link, r["system"], r["schedule"],
              r["micro_batches"], r["transport"], ms, float(r["eager_ms"]) / ms, best / ms,
              r["outside_ms"] or "", r["outside_ratio"] or ""))
EOF
}

cards() { nvidia-smi --query-gpu=name --format=csv,noheader | head -2 | sort | uniq -c | awk '{$1=$1" x"; print}' | tr '\n' ' ' | sed 's/ $//'; }

run_parts w2 "$@"
