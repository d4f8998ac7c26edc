#!/bin/bash
# deploy/ for real with a container engine (ctest deploy.containers): the
# images built by deploy/images.sh from a debootstrap base (CPU runtime image
# from this build's binaries, Prometheus from Debian's package), then
# deploy/docker-compose.yml brought up through podman's Docker API with
# Debian's docker-compose: a job submitted with the CLI through the published
# port, a stage server crashing mid-job (killed from the host), its container
# restarted by the restart policy, the job recovering to success, Prometheus
# scraping every server, and the cluster brought down. Removes its containers, volumes, network and images
# and its temporary folder. Exit 77 (ctest: skipped) without root, podman,
# debootstrap or docker-compose.
#
#   tests/deploy/containers_test.sh BIN_DIR
set -uo pipefail
bin=$(cd "${1:?usage: containers_test.sh BIN_DIR}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "podman here runs as root (rootless needs subordinate ids); run ctest as root"
for p in podman debootstrap docker-compose runc curl; do
  command -v "$p" > /dev/null || skip "no $p: scripts/setup.sh installs it"
done
for p in stage_server coordinator conveyor; do [ -x "$bin/$p" ] || { echo "FAIL: no $bin/$p"; exit 1; }; done

export CONTAINERS_CONF=${CONTAINERS_CONF:-$src/deploy/podman/containers.conf}
tag=test-$$
project=conveyor-test-$$
tmp=$(mktemp -d -t conveyor-containers.XXXXXX)  # under $TMPDIR (ctest: build/test-tmp)
service=
say() { echo "$(date +%T) $*"; }
compose() { docker-compose -p "$project" -f "$src/deploy/docker-compose.yml" "$@"; }
cleanup() {
  if [ -n "$service" ]; then
    compose down --volumes --timeout 5 > "$tmp/down-cleanup.log" 2>&1
    kill "$service" 2> /dev/null
    wait "$service" 2> /dev/null
  fi
  podman rmi -f "localhost/conveyor:$tag" "localhost/conveyor-prometheus:$tag" "localhost/conveyor-base:$tag" \
    > /dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  say "FAIL: $*"
  for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -40 "$f"; }; done
  [ -n "$service" ] && compose logs --no-color --tail 30 2>&1 | tail -120
  exit 1
}
# Polls `condition` (a command) every 0.2 s until it holds or `seconds` pass.
await() {  # SECONDS WHAT COMMAND...
  local seconds=$1 what=$2 end=$(( $(date +%s) + $1 ))
  shift 2
  until "$@"; do
    [ "$(date +%s)" -lt "$end" ] || fail "$what: not within $seconds s"
    sleep 0.2
  done
}

# 1. The images.
t0=$(date +%s)
"$src/deploy/images.sh" --bin "$bin" --tag "$tag" base cpu prometheus > "$tmp/images.log" 2>&1 || fail "deploy/images.sh failed"
grep '^images:' "$tmp/images.log"
say "images built in $(( $(date +%s) - t0 )) s"

# 2. Podman's Docker API on a socket of our own.
podman system service --time=0 "unix://$tmp/podman.sock" > "$tmp/podman-service.log" 2>&1 &
service=$!
export DOCKER_HOST=unix://$tmp/podman.sock
api_up() { curl -sf --unix-socket "$tmp/podman.sock" http://d/_ping > /dev/null; }
await 30 "podman's API" api_up

# 3. The cluster, each host port picked by the engine (read back below).
export CONVEYOR_IMAGE=localhost/conveyor:$tag CONVEYOR_PROMETHEUS_IMAGE=localhost/conveyor-prometheus:$tag
export CONVEYOR_COORDINATOR_PORT= CONVEYOR_STAGE0_PORT= CONVEYOR_STAGE1_PORT= CONVEYOR_PROMETHEUS_PORT=
t1=$(date +%s)
compose up -d --no-build > "$tmp/up.log" 2>&1 &
up=$!
# Podman runs a container's health check through systemd timers, which this
# host lacks: run the stages' checks here until Compose sees them healthy
# and starts the coordinator (depends_on: service_healthy).
container() { compose ps -q "$1" 2> /dev/null | head -1; }
checks_pass() {
  local ok=0 c
  for s in stage0 stage1; do
    c=$(container "$s")
    [ -n "$c" ] && podman healthcheck run "$c" > /dev/null 2>&1 && ok=$((ok + 1))
  done
  [ "$ok" = 2 ] && ! kill -0 "$up" 2> /dev/null
}
await 120 "the stages' health checks and compose up" checks_pass
wait "$up" || fail "docker-compose up failed"
port() { compose port "$1" "$2" | sed 's/.*://'; }
cport=$(port coordinator 50050)
pport=$(port prometheus 9090)
[ -n "$cport" ] && [ -n "$pport" ] || fail "no published port for the coordinator or Prometheus"
coordinator=127.0.0.1:$cport
healthy() { "$bin/conveyor" health "$coordinator" > /dev/null 2>&1; }
await 60 "the coordinator's health" healthy
say "cluster up in $(( $(date +%s) - t1 )) s: coordinator $coordinator, Prometheus 127.0.0.1:$pport"

# 4. A job through the published port; a stage container killed mid-job, as
# soon as stage1 has written its first checkpoint into its volume (watched on
# the host: polling the CLI, each poll a process, once saw the checkpoint 16 s
# after the submission, when the 2000 steps had already ended). The volume's
# path and stage1's PID are read before the submission: on a loaded 2-core
# machine one podman call can take seconds, and once took the 11 s that an
# 800-step job trains for.
volume=$(podman volume inspect -f '{{.Mountpoint}}' "${project}_stage1-checkpoints") || fail "no stage1 volume"
first_pid=$(podman inspect -f '{{.State.Pid}}' "$(container stage1)")
[ -n "$first_pid" ] && [ "$first_pid" -gt 0 ] || fail "no PID for stage1's container"
cat > "$tmp/job.yaml" <<JOB
name: compose-test
model: {name: convnet, num_classes: 10}
partition: {stages: 2}
data: {name: fashion-mnist, path: /usr/share/datasets/fashion-mnist}
batch_size: 64
micro_batches: 2
optimizer: {name: adam, lr: 0.001}
steps: 1600
checkpoint_every: 50
seed: 7
JOB
job=$("$bin/conveyor" --coordinator "$coordinator" submit "$tmp/job.yaml" 2> "$tmp/submit.log" | grep -oE 'job-[0-9]+' | head -1)
[ -n "$job" ] || fail "submit printed no job id"
status() { "$bin/conveyor" --coordinator "$coordinator" status "$job" --json 2> /dev/null; }
field() { status | python3 -c "import json,sys; print(json.load(sys.stdin).get('$1', ''))" 2> /dev/null; }
written() { compgen -G "$volume/$job/stage-1/step-*.ckpt" > /dev/null; }
await 180 "$job's first checkpoint on stage1" written
# A crash, not `podman kill` (an engine's kill or stop is the user's, which a
# restart policy leaves alone): the stage server, PID 1 of its container,
# killed from the host. Its restart policy (unless-stopped) brings it back.
kill -KILL "$first_pid" || fail "kill $first_pid"
at_kill=$(basename "$(compgen -G "$volume/$job/stage-1/step-*.ckpt" | tail -1)")
say "stage1 wrote $at_kill: its server crashed (SIGKILL)"
recovered() { [ "$(field recoveries)" -ge 1 ] 2> /dev/null; }
back() {
  local pid
  pid=$(podman inspect -f '{{.State.Pid}}' "$(container stage1)" 2> /dev/null)
  [ -n "$pid" ] && [ "$pid" -gt 0 ] && [ "$pid" != "$first_pid" ]
}
await 60 "stage1 started again by its restart policy" back
say "stage1's container started again by its restart policy"
ended() { case "$(field state)" in succeeded|failed|cancelled) return 0 ;; esac; return 1; }
await 300 "$job's end" ended
"$bin/conveyor" --coordinator "$coordinator" status "$job" > "$tmp/status.log" 2>&1
[ "$(field state)" = succeeded ] || fail "$job did not succeed: $(field state) $(field error)"
recovered || fail "$job succeeded without a recovery after the kill (stage1's newest checkpoint then: $at_kill)"
say "$job succeeded after $(field recoveries) recovery: $(grep -iE 'recover' "$tmp/status.log" | head -3 | tr -s ' ' | tr '\n' ' ')"

# 5. Prometheus scraped the three servers.
scraped() {
  curl -sf "http://127.0.0.1:$pport/api/v1/query?query=sum(conveyor_up)" |
    python3 -c "import json,sys; r=json.load(sys.stdin)['data']['result']; sys.exit(0 if r and float(r[0]['value'][1]) >= 3 else 1)"
}
await 60 "Prometheus's conveyor_up from the coordinator and both stages" scraped
say "Prometheus scrapes conveyor_up from the coordinator and both stages"

# 6. Down, nothing left.
t2=$(date +%s)
compose down --volumes --timeout 10 > "$tmp/down.log" 2>&1 || fail "docker-compose down failed"
left=$(podman ps -a -q --filter "label=com.docker.compose.project=$project"; podman volume ls -q --filter "label=com.docker.compose.project=$project"; podman network ls -q --filter "label=com.docker.compose.project=$project")
[ -z "$left" ] || fail "left behind by docker-compose down: $left"
say "cluster down in $(( $(date +%s) - t2 )) s, nothing left; whole test $(( $(date +%s) - t0 )) s"
