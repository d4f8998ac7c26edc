#!/bin/bash
# deploy/slurm/conveyor.sbatch against a real Slurm (ctest deploy.slurm): a
# one-node cluster on loopback under a temporary folder (munged, slurmctld and
# slurmd as root), a small job through sbatch, preempted once by hand
# (SIGUSR1 as --signal sends it), requeued, and ending at the param digest of
# the same job's `conveyor local` run. Stops the daemons and leaves nothing
# behind. Exit 77 (ctest: skipped) where Slurm cannot run here.
#
#   tests/deploy/slurm_test.sh BIN_DIR
set -uo pipefail
bin=$(cd "${1:?usage: slurm_test.sh BIN_DIR}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "slurmd must run as root to start jobs as their user; run ctest as root"
for p in munged slurmctld slurmd sbatch scontrol; do
  command -v "$p" >/dev/null || skip "no $p: install slurm-wlm and munge (scripts/setup.sh lists them)"
done
for p in stage_server coordinator conveyor; do [ -x "$bin/$p" ] || { echo "FAIL: no $bin/$p"; exit 1; }; done

tmp=$(mktemp -d /tmp/conveyor-slurm.XXXXXX)
chmod 711 "$tmp"  # munged wants its socket folder searchable
pids=()
cleanup() {
  # Jobs first (their processes belong to slurmd), then the daemons we started.
  [ -n "${job:-}" ] && scancel "$job" 2>/dev/null
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
say() { echo "$(date +%T) $*"; }
fail() {
  say "FAIL: $*"
  for f in "$tmp"/*.log "$tmp"/run/logs/*.log "$tmp"/out-*.txt; do [ -f "$f" ] && { echo "--- $f"; tail -30 "$f"; }; done
  exit 1
}

# munge, on its own socket and key.
dd if=/dev/urandom of="$tmp/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge.key"
munged -F --force --socket="$tmp/munge.socket" --key-file="$tmp/munge.key" --pid-file="$tmp/munged.pid" \
  --log-file="$tmp/munged.log" --seed-file="$tmp/munged.seed" &
pids+=($!)

# Two free ports on loopback (Slurm takes fixed ones).
read -r ctld_port slurmd_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
node=$(hostname -s)
mkdir -p "$tmp/ctld" "$tmp/slurmd"
cat > "$tmp/slurm.conf" <<CONF
ClusterName=conveyortest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$tmp/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$tmp/ctld
SlurmdSpoolDir=$tmp/slurmd
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
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
NodeName=$node NodeAddr=127.0.0.1 CPUs=4 RealMemory=2000 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$tmp/slurm.conf
slurmctld -D -i -f "$SLURM_CONF" > "$tmp/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N "$node" -f "$SLURM_CONF" > "$tmp/slurmd.out" 2>&1 &
pids+=($!)
say "slurm: slurmctld on 127.0.0.1:$ctld_port, slurmd $node on 127.0.0.1:$slurmd_port, folder $tmp"

# Readiness: the controller answers, then the node registers (a job waits
# for it anyway; this only bounds the wait and says which daemon failed).
deadline=$((SECONDS + 60))
until scontrol ping 2>/dev/null | grep -q "is UP"; do
  [ "$SECONDS" -lt "$deadline" ] || fail "slurmctld did not answer within 60 s"
  kill -0 "${pids[1]}" 2>/dev/null || fail "slurmctld exited"
  sleep 0.2
done

# The job: small, but long enough to be preempted in the middle.
cat > "$tmp/job.yaml" <<'JOB'
name: slurm
model: {name: mlp, input_dim: 32, hidden: [64, 32]}
partition: {stages: 2}
data: {name: synthetic, train_samples: 1024}
batch_size: 32
micro_batches: 4
schedule: 1f1b
optimizer: {name: adam, lr: 0.001}
seed: 11
steps: 400
checkpoint_every: 1000
JOB
digest() { sed -n 's/.*"param_digest":"\([0-9a-f]*\)".*/\1/p' | tail -1; }
local_digest=$("$bin/conveyor" local "$tmp/job.yaml" --device cpu --json --curves "" 2> "$tmp/local.log" | digest)
[ -n "$local_digest" ] || fail "conveyor local printed no param_digest ($(tail -3 "$tmp/local.log"))"
say "conveyor local: param_digest $local_digest"

run=$tmp/run
job=$(CONVEYOR_BIN=$bin CONVEYOR_RUN_DIR=$run CONVEYOR_DEVICE=cpu CONVEYOR_LISTEN_HOST=127.0.0.1 \
      CONVEYOR_STAGE_HOST=127.0.0.1 CONVEYOR_START_TIMEOUT=60 \
      sbatch --parsable --chdir="$tmp" --output="$tmp/out-%j.txt" --ntasks-per-node=2 --cpus-per-task=2 \
             "$src/deploy/slurm/conveyor.sbatch" "$tmp/job.yaml") || fail "sbatch refused the script"
say "sbatch: Slurm job $job"

# Wait for a Slurm job state (scontrol), or the conveyor job's progress.
slurm_state() { scontrol show job -o "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
# Steps done, from the coordinator's log (it logs every 8 steps here): cheap
# enough to ask often, unlike a `conveyor status` that loads LibTorch.
conveyor_step() {
  grep -o 'step [0-9]*/400' "$run/logs/coordinator.log" 2>/dev/null | tail -1 | sed 's|step \([0-9]*\)/.*|\1|'
}
deadline=$((SECONDS + 120))
until [ "$(conveyor_step)" -ge 8 ] 2>/dev/null; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the job made no progress within 120 s (Slurm state $(slurm_state))"
  case "$(slurm_state)" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL) fail "Slurm job ended early: $(slurm_state)";; esac
  sleep 0.2
done
# What Slurm's --signal=B:USR1@300 does before the time limit, sent while
# the stage servers are stopped (SIGSTOP; found by their checkpoint folders in
# this run), so that the job cannot end before the script has asked for the
# checkpoint however fast this machine trains.
stage_pids=$(pgrep -f -- "--checkpoint-dir $run/stage-")
[ -n "$stage_pids" ] || fail "no stage server processes of this run"
kill -STOP $stage_pids
scancel --signal=USR1 --batch "$job" || fail "scancel --signal=USR1 failed"
say "sent SIGUSR1 to the batch script at conveyor step $(conveyor_step)"
deadline=$((SECONDS + 60))
until grep -q "asked the coordinator for a checkpoint" "$tmp/out-$job.txt"; do
  [ "$SECONDS" -lt "$deadline" ] || { kill -CONT $stage_pids; fail "the script did not ask for a checkpoint within 60 s"; }
  sleep 0.2
done
kill -CONT $stage_pids
deadline=$((SECONDS + 180))
released=0
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
[ -n "${CONVEYOR_SLURM_TEST_SHOW:-}" ] && cat "$tmp/out-$job.txt" | grep -v '^{' >&2
info=$(scontrol show job -o "$job")
out=$(cat "$tmp"/out-"$job".txt)
restarts=$(sed -n 's/.*Restarts=\([0-9]*\).*/\1/p' <<< "$info")
exit_code=$(sed -n 's/.*ExitCode=\([0-9:]*\).*/\1/p' <<< "$info")
slurm_digest=$(digest <<< "$out")
grep -q "checkpoint of step [0-9]* complete; requeueing" <<< "$out" || fail "the script did not checkpoint and requeue on SIGUSR1"
grep -q "following job" <<< "$out" || fail "the requeued script did not follow the job it submitted"
[ "$restarts" = 1 ] || fail "expected one requeue, Slurm says Restarts=$restarts"
[ "$exit_code" = 0:0 ] || fail "the batch job exited $exit_code"
taken=$(sed -n 's/.*checkpoint of step \([0-9]*\) complete; requeueing.*/\1/p' <<< "$out")
grep -q "checkpoint of step $taken taken on request (the coordinator got SIGUSR1)" <<< "$out" ||
  fail "no event of the checkpoint of step $taken that SIGUSR1 asked for"
grep -q "restored every stage from the checkpoint of step $taken\"" <<< "$out" ||
  fail "the requeued job did not resume from the checkpoint of step $taken"
[ "$slurm_digest" = "$local_digest" ] || fail "sbatch's param_digest '$slurm_digest' differs from conveyor local's $local_digest"
say "PASS: sbatch (preempted once, requeued) ended at conveyor local's param_digest $local_digest"
