#!/bin/bash
# deploy/slurm/conveyor.sbatch across Slurm nodes (ctest deploy.slurm_nodes):
# three slurmd "nodes", each in its own network and UTS namespace (its own
# hostname, its own address on a bridge, its own processes), a slurmctld and
# one munged outside them, all under a temporary folder; `srun -N 3` must see
# three hosts. Then:
#   1. sbatch -N 2 (two stages on each node, dialled at the nodes' addresses):
#      preempted once by hand (SIGUSR1 as --signal sends it), requeued, ending
#      at the param digest of the same job's `conveyor local` run;
#   2. sbatch -N 3 (one stage on each, mutual TLS between all): every process
#      of one node that is not the batch node (its slurmd, slurmstepd and stage
#      server) killed mid-run, its slurmd started again; the script starts the
#      stage server again on that node at its address, the job recovers and
#      ends at the same digest;
#   3. sbatch -N 3 again, node3 lost for good (its processes killed, its
#      slurmd not started again until the job is over): Slurm marks it DOWN
#      and, the script asking --no-kill, keeps the allocation; the script does
#      not start the stage again, and the job folds the lost stage onto the
#      other two (on_lost_server: replan) and ends at the same digest;
#   4. the ssh launch of docs/operations.md ("Several nodes"), read from the
#      document, with `ssh HOST` entering the node's namespaces: the same digest.
# Stops everything it started and leaves nothing behind. Exit 77 (ctest:
# skipped) where Slurm or namespaces cannot run here.
#
#   tests/deploy/slurm_nodes_test.sh BIN_DIR
set -uo pipefail
bin=$(cd "${1:?usage: slurm_nodes_test.sh BIN_DIR}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "network namespaces and slurmd need root; run ctest as root"
for p in munged slurmctld slurmd sbatch srun scontrol scancel; do
  command -v "$p" >/dev/null || skip "no $p: install slurm-wlm and munge (scripts/setup.sh lists them)"
done
for p in ip nsenter unshare hostname; do command -v "$p" >/dev/null || skip "no $p: install iproute2 and util-linux"; done
for p in stage_server coordinator conveyor; do [ -x "$bin/$p" ] || { echo "FAIL: no $bin/$p"; exit 1; }; done

nodes=(node1 node2 node3)
tag=$$                                  # names of our own: other tests may run beside this one
bridge=cvsb$tag
ns=() veth=()
for i in "${!nodes[@]}"; do ns+=("cvs$tag-${nodes[i]}"); veth+=("cvs${tag}v$i"); done
tmp=$(mktemp -d /tmp/conveyor-slurm-nodes.XXXXXX)
chmod 711 "$tmp"  # munged wants its socket folder searchable
pids=() jobs_=()
kill_node() {  # every process in node $1's network namespace, until none is left
  local left
  for _ in $(seq 100); do
    left=$(ip netns pids "${ns[$1]}" 2>/dev/null)
    [ -z "$left" ] && return 0
    kill -KILL $left 2>/dev/null
    sleep 0.1
  done
  echo "processes left in ${ns[$1]}: $left"
}
cleanup() {
  # Jobs first (their processes belong to the slurmds), then the daemons, then
  # whatever is left in the nodes' namespaces, the links and namespaces, the
  # folder.
  for j in "${jobs_[@]}"; do scancel "$j" 2>/dev/null; done
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  for i in "${!ns[@]}"; do [ -e "/run/netns/${ns[i]}" ] && kill_node "$i"; done
  for i in "${!ns[@]}"; do
    ip netns del "${ns[i]}" 2>/dev/null
    ip link del "${veth[i]}" 2>/dev/null
  done
  ip link del "$bridge" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
say() { echo "$(date +%T) $*"; }
fail() {
  say "FAIL: $*"
  local f
  for f in "$tmp"/out-*.txt "$tmp"/ssh-block.out "$tmp"/run-*/logs/*.log "$tmp"/home/*.log "$tmp"/slurm*.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -25 "$f"; }
  done
  exit 1
}

# The network: a bridge outside (the controller's address .1) and a veth pair
# into each node's namespace (.11, .12, ...), on a /24 of 10.78 that no
# interface here uses yet.
net=
for n in $(seq 0 255); do
  ip -o -4 addr | grep -q " 10\.78\.$n\." || { net=10.78.$n; break; }
done
[ -n "$net" ] || skip "every 10.78.N.0/24 is in use here"
ip link add "$bridge" type bridge 2>/dev/null || skip "cannot create a bridge (ip link add type bridge): no CAP_NET_ADMIN here?"
ip addr add "$net.1/24" dev "$bridge" && ip link set "$bridge" up || fail "cannot set up $bridge"
addr=()
for i in "${!nodes[@]}"; do
  addr+=("$net.$((11 + i))")
  ip netns add "${ns[i]}" 2>/dev/null || skip "cannot create a network namespace (ip netns add)"
  ip link add "${veth[i]}" type veth peer name eth0 netns "${ns[i]}" || fail "cannot create a veth pair"
  ip link set "${veth[i]}" master "$bridge" && ip link set "${veth[i]}" up || fail "cannot put ${veth[i]} on $bridge"
  ip -n "${ns[i]}" addr add "${addr[i]}/24" dev eth0 && ip -n "${ns[i]}" link set eth0 up &&
    ip -n "${ns[i]}" link set lo up || fail "cannot set up ${ns[i]}'s links"
done
unshare --uts true 2>/dev/null || skip "cannot create a UTS namespace (unshare --uts)"

# munge, on its own socket and key: a Unix socket in the file system, which
# the nodes' namespaces share.
dd if=/dev/urandom of="$tmp/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge.key"
munged -F --force --socket="$tmp/munge.socket" --key-file="$tmp/munge.key" --pid-file="$tmp/munged.pid" \
  --log-file="$tmp/munged.log" --seed-file="$tmp/munged.seed" &
pids+=($!)

# slurmctld listens on the bridge's side; each slurmd in its namespace on the
# same port (one port per namespace).
ctld_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("'"$net.1"'", 0)); print(s.getsockname()[1])')
slurmd_port=$((ctld_port + 1))
mkdir -p "$tmp/ctld"
{
  cat <<CONF
ClusterName=conveyornodes
SlurmctldHost=$(hostname -s)($net.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$tmp/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$tmp/ctld
SlurmdSpoolDir=$tmp/slurmd-%n
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd-%n.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerParameters=defer_batch=0
MinJobAge=600
SlurmdTimeout=10
CONF
  for i in "${!nodes[@]}"; do
    echo "NodeName=${nodes[i]} NodeHostname=${nodes[i]} NodeAddr=${addr[i]} CPUs=2 RealMemory=2000 State=UNKNOWN"
  done
  echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} > "$tmp/slurm.conf"
export SLURM_CONF=$tmp/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" > "$tmp/slurmctld.out" 2>&1 &
pids+=($!)
start_node() {  # slurmd of node $1 in its namespaces, with its own hostname
  # nsenter, not `ip netns exec`, which mounts a /sys of the namespace's own
  # without the cgroup file systems that slurmd wants to see.
  mkdir -p "$tmp/slurmd-${nodes[$1]}"
  nsenter --net="/run/netns/${ns[$1]}" unshare --uts \
    bash -c 'hostname "$0" && exec slurmd -D -N "$0" -f "$SLURM_CONF"' "${nodes[$1]}" \
    >> "$tmp/slurmd-${nodes[$1]}.out" 2>&1 &
  pids+=($!)
}
for i in "${!nodes[@]}"; do start_node "$i"; done
say "slurm: slurmctld on $net.1:$ctld_port; ${nodes[*]} at ${addr[*]} (namespaces ${ns[*]}); folder $tmp"

# Readiness: the controller answers, then every node registers (a job waits
# for its nodes anyway; this bounds the wait and says which daemon failed).
nodes_idle() { [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')" = "${#nodes[@]}" ]; }
deadline=$((SECONDS + 60))
until nodes_idle; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the nodes did not all register within 60 s: $(sinfo -h -N -o '%N %t' | tr '\n' ' ')"
  kill -0 "${pids[1]}" 2>/dev/null || fail "slurmctld exited"
  sleep 0.2
done
# Each node is a host of its own to the jobs it runs.
names=$(srun -N 3 --ntasks-per-node=1 bash -c 'echo "$(hostname) $(ip -4 -o addr show eth0 | awk "{print \$4}")"' | sort | tr '\n' ' ')
[ "$names" = "node1 $net.11/24 node2 $net.12/24 node3 $net.13/24 " ] || fail "srun -N 3 saw the hosts '$names'"
say "srun -N 3: $names"

# The jobs: small, but long enough to be interrupted in the middle. The one
# preempted takes no checkpoint but the one SIGUSR1 asks for (the requeued job
# must resume from that one), the one whose node is killed one every 50 steps.
job_yaml() {  # $1: stages, $2: checkpoint_every
  cat <<JOB
name: slurm-nodes
model: {name: mlp, input_dim: 32, hidden: [64, 32, 32]}
partition: {stages: $1}
data: {name: synthetic, train_samples: 1024}
batch_size: 32
micro_batches: 4
schedule: 1f1b
optimizer: {name: adam, lr: 0.001}
seed: 13
steps: 300
checkpoint_every: $2
JOB
}
job_yaml 4 1000 > "$tmp/job-4.yaml"
job_yaml 3 50 > "$tmp/job-3.yaml"
{ cat "$tmp/job-3.yaml"; echo "lost_after: 25"; echo "recovery_timeout: 60"; } > "$tmp/job-lost.yaml"
digest() { sed -n 's/.*"param_digest":"\([0-9a-f]*\)".*/\1/p' | tail -1; }
# One `conveyor local` run: how the layers are cut into stages, and
# checkpoints, change no arithmetic (the equality tests hold every partition
# to the reference bit for bit), so every job here ends at its digest.
local_digest=$("$bin/conveyor" local "$tmp/job-3.yaml" --device cpu --json --curves "" 2> "$tmp/local.log" | digest)
[ -n "$local_digest" ] || fail "conveyor local printed no param_digest ($(tail -3 "$tmp/local.log"))"
say "conveyor local: param_digest $local_digest"

# Submits job $1.yaml with sbatch options $2.. into the run folder run-$1; sets
# job (the Slurm job id) and run.
submit() {
  local name=$1; shift
  run=$tmp/run-$name
  job=$(CONVEYOR_BIN=$bin CONVEYOR_RUN_DIR=$run CONVEYOR_DEVICE=cpu CONVEYOR_STAGE_HOST=nodeaddr \
        CONVEYOR_START_TIMEOUT=60 CONVEYOR_WATCH_INTERVAL=1 CONVEYOR_ARGS=${args:-} \
        sbatch --parsable --chdir="$tmp" --output="$tmp/out-%j.txt" "$@" \
               "$src/deploy/slurm/conveyor.sbatch" "$tmp/job-$name.yaml") || fail "sbatch refused the script"
  jobs_+=("$job")
  say "sbatch $*: Slurm job $job"
}
slurm_state() { scontrol show job -o "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
# Steps done, from the coordinator's log: cheap enough to ask often, unlike a
# `conveyor status` that loads LibTorch.
conveyor_step() {
  grep -o 'step [0-9]*/300' "$run/logs/coordinator.log" 2>/dev/null | tail -1 | sed 's|step \([0-9]*\)/.*|\1|'
}
wait_for_step() {  # $1: at least this step
  local deadline=$((SECONDS + 120))
  until [ "$(conveyor_step)" -ge "$1" ] 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || fail "the job did not reach step $1 within 120 s (Slurm state $(slurm_state))"
    case "$(slurm_state)" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL) fail "Slurm job ended early: $(slurm_state)";; esac
    sleep 0.2
  done
}
wait_for_completion() {
  local deadline=$((SECONDS + 180)) released=0
  until [ "$(slurm_state)" = COMPLETED ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "Slurm job $job did not complete within 180 s (state $(slurm_state))"
    # Slurm holds a requeued batch job back for about two minutes (its
    # BeginTime, once it has ended); a real preemption waits for free nodes
    # anyway. Release it then.
    if [ $released = 0 ] && scontrol show job -o "$job" | grep -q "JobState=PENDING Reason=BeginTime"; then
      scontrol update JobId="$job" StartTime=now && released=1 && say "requeued; released at once"
    fi
    case "$(slurm_state)" in FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) fail "Slurm job $job ended $(slurm_state)";; esac
    sleep 0.5
  done
  say "Slurm job $job completed"
  out=$(cat "$tmp/out-$job.txt")
  info=$(scontrol show job -o "$job")
  [ -n "${CONVEYOR_SLURM_TEST_SHOW:-}" ] && grep -v '^{' <<< "$out" >&2
  local exit_code
  exit_code=$(sed -n 's/.*ExitCode=\([0-9:]*\).*/\1/p' <<< "$info")
  [ "$exit_code" = 0:0 ] || fail "the batch job exited $exit_code"
}
# The stages the script found: each at its node's address, $1 of them on
# each node of the allocation, in rank order.
check_stages() {  # $1: stages per node; $2..: the nodes' indices
  local per=$1 want=() i k; shift
  for i in "$@"; do for ((k = 0; k < per; k++)); do want+=("${addr[i]}:[0-9]*"); done; done
  grep -q "stages: $(IFS=,; echo "${want[*]}")\$" <<< "$out" ||
    fail "expected stages at $(IFS=,; echo "${want[*]}"), the script said: $(grep -o 'stages: .*' <<< "$out" | head -1)"
}

# The job's param_digest, from the batch output, must be conveyor local's.
expect_digest() {  # $1: the run, as the failure names it
  slurm_digest=$(digest <<< "$out")
  [ "$slurm_digest" = "$local_digest" ] ||
    fail "$1's param_digest '$slurm_digest' differs from conveyor local's $local_digest"
}

# 1. Two nodes, two stages on each (links within a node and between nodes),
#    preempted once.
submit 4 -N 2 --ntasks-per-node=2 --cpus-per-task=1
wait_for_step 8
# What Slurm's --signal=B:USR1@300 does before the time limit, sent while the
# stage servers are stopped (SIGSTOP; found by their checkpoint folders in this
# run), so that the job cannot end before the script has asked for the
# checkpoint however fast this machine trains.
stage_pids=$(pgrep -f -- "--checkpoint-dir $run/stage-")
[ "$(wc -w <<< "$stage_pids")" = 4 ] || fail "expected 4 stage server processes of this run, found: $stage_pids"
kill -STOP $stage_pids
scancel --signal=USR1 --batch "$job" || fail "scancel --signal=USR1 failed"
say "sent SIGUSR1 to the batch script at conveyor step $(conveyor_step)"
deadline=$((SECONDS + 60))
until grep -q "asked the coordinator for a checkpoint" "$tmp/out-$job.txt"; do
  [ "$SECONDS" -lt "$deadline" ] || { kill -CONT $stage_pids; fail "the script did not ask for a checkpoint within 60 s"; }
  sleep 0.2
done
kill -CONT $stage_pids
wait_for_completion
check_stages 2 0 1
restarts=$(sed -n 's/.*Restarts=\([0-9]*\).*/\1/p' <<< "$info")
[ "$restarts" = 1 ] || fail "expected one requeue, Slurm says Restarts=$restarts"
taken=$(sed -n 's/.*checkpoint of step \([0-9]*\) complete; requeueing.*/\1/p' <<< "$out")
[ -n "$taken" ] || fail "the script did not checkpoint and requeue on SIGUSR1"
grep -q "following job" <<< "$out" || fail "the requeued script did not follow the job it submitted"
grep -q "restored every stage from the checkpoint of step $taken\"" <<< "$out" ||
  fail "the requeued job did not resume from the checkpoint of step $taken"
expect_digest "sbatch -N 2"
say "PASS: sbatch -N 2 (4 stages; preempted at step $taken, requeued) ended at conveyor local's param_digest $slurm_digest"

# 2. Three nodes, one stage on each, with mutual TLS between every two
#    (one certificate naming the three nodes' addresses and 127.0.0.1, where
#    the script's CLI finds the coordinator); every process of the last node
#    killed mid-run (its slurmd, slurmstepd and stage server), then its slurmd
#    started again: the script starts that stage again at its address and the
#    coordinator resumes the job from its last checkpoint.
"$src/scripts/make-certs.sh" "$tmp/pki" node "${addr[@]}" 127.0.0.1 2> "$tmp/make-certs.log" ||
  fail "scripts/make-certs.sh failed: $(tail -3 "$tmp/make-certs.log")"
args="--tls-cert $tmp/pki/node.crt --tls-key $tmp/pki/node.key --tls-ca $tmp/pki/ca.crt"
submit 3 -N 3 --ntasks-per-node=1 --cpus-per-task=1
args=
wait_for_step 60  # past the checkpoint of step 50
batch_host=$(scontrol show job -o "$job" | sed -n 's/.*BatchHost=\([^ ]*\).*/\1/p')
[ "$batch_host" = node1 ] || fail "expected the batch script on node1, Slurm says $batch_host"
at=$(conveyor_step)
kill_node 2
say "killed every process of node3 (${ns[2]}) at conveyor step $at"
start_node 2
wait_for_completion
check_stages 1 0 1 2
grep -q "stage 2 at ${addr[2]}:[0-9]* does not answer; starting it again on node3" <<< "$out" ||
  fail "the script did not start stage 2 again on node3"
grep -q "): recovering\"" <<< "$out" || fail "the job's events do not say it recovered from a failed stage"
grep -q "recovered: training goes on from step" <<< "$out" || fail "the job's events do not say it went on"
expect_digest "sbatch -N 3"
grep -q "mutual TLS as /CN=node" "$run/logs/coordinator.log" || fail "the coordinator did not run with TLS"
recoveries=$(sed -n 's/.*"recoveries":\([0-9]*\).*/\1/p' <<< "$out" | tail -1)
restarted=$(grep -o "stage [0-9]* at [0-9.:]* does not answer; starting it again on node[0-9]" <<< "$out" |
            sed 's/ at .*on / on /' | tr '\n' ',')
say "PASS: sbatch -N 3 (node3's processes killed at step $at, node3 back; restarted: ${restarted%,};" \
    "recoveries: ${recoveries:-0}) ended at conveyor local's param_digest $slurm_digest"

# 3. Three nodes again, node3 lost for good mid-run.
submit lost -N 3 --ntasks-per-node=1 --cpus-per-task=1
wait_for_step 60  # past the checkpoint of step 50
at=$(conveyor_step)
kill_node 2
say "killed every process of node3 (${ns[2]}) for good at conveyor step $at"
wait_for_completion
start_node 2
grep -q "stage 2's node node3 is down; not starting it again" <<< "$out" ||
  fail "the script did not say it leaves node3's stage down"
grep -q "lost for good" <<< "$out" || fail "the job's events do not say it went on without the lost server"
grep -q "\"lost_servers\":\[\"${addr[2]}:" <<< "$out" || fail "the job's status does not name node3's server as lost"
expect_digest "sbatch -N 3 without node3"
say "PASS: sbatch -N 3, node3 lost for good at step $at: the job folded its stage and ended at conveyor local's param_digest $slurm_digest"
deadline=$((SECONDS + 60))
until nodes_idle; do
  [ "$SECONDS" -lt "$deadline" ] || fail "node3 did not come back within 60 s: $(sinfo -h -N -o '%N %t' | tr '\n' ' ')"
  sleep 0.5
done

# 4. Without Slurm: the ssh block of docs/operations.md ("Several nodes") as it
#    stands, run from the bridge's side, `ssh HOST` entering that node's
#    namespaces in the shared folder ($home, as ssh starts in the home folder)
#    and the nodes' names resolved by an /etc/hosts of this test's own (bound
#    in a mount namespace of its own).
block=$(awk '/deploy.slurm_nodes runs this block/ {f = 1; next} f && /^```sh/ {b = 1; next} b && /^```/ {exit} b' \
        "$src/docs/operations.md")
[ -n "$block" ] || fail "no ssh block under its docs-test marker in docs/operations.md"
home=$tmp/home
mkdir -p "$home"
cp "$tmp/job-3.yaml" "$home/job.yaml"
{ cat /etc/hosts; for i in "${!nodes[@]}"; do echo "${addr[i]} ${nodes[i]}"; done; } > "$tmp/hosts"
{
  echo "set -euo pipefail"
  echo "PATH=$bin:\$PATH"
  echo "ssh() {  # ssh -n HOST COMMAND...: COMMAND in HOST's namespaces, from the shared home"
  echo "  [ \"\$1\" = -n ] && shift"
  echo "  local host=\$1; shift"
  echo "  nsenter --net=/run/netns/cvs$tag-\$host unshare --uts \\"
  echo "    bash -c 'hostname \"\$0\" && cd \"\$1\" && eval \"\${*:2}\"' \"\$host\" \"$home\" \"\$@\" < /dev/null"
  echo "}"
  echo "cd $home"
  echo "$block"
} > "$tmp/ssh-block.sh"
say "the ssh block of docs/operations.md, from $tmp/ssh-block.sh"
timeout 180 unshare --mount bash -c 'mount --bind "$0" /etc/hosts && exec bash "$1"' "$tmp/hosts" "$tmp/ssh-block.sh" \
  > "$tmp/ssh-block.out" 2>&1
rc=$?
[ $rc = 0 ] || fail "the ssh block exited $rc: $(tail -5 "$tmp/ssh-block.out")"
ssh_digest=$("$bin/conveyor" --coordinator "${addr[0]}:50050" status job-1 --json 2> "$tmp/ssh-status.log" | digest)
for i in "${!nodes[@]}"; do kill_node "$i"; done  # the servers the block started, and the slurmds
[ "$ssh_digest" = "$local_digest" ] ||
  fail "the ssh block's job ended at param_digest '$ssh_digest', conveyor local's is $local_digest"
say "PASS: the ssh block (3 hosts, no Slurm) ended at conveyor local's param_digest $ssh_digest"
