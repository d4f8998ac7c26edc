// The job keys of failures and checkpoints: timeouts, checkpoints and their
// copies, and what a job does when a stage server is lost (docs/recovery.md).
#include "plan/job_key_rows.h"

#include "plan/job_spec.h"

namespace conveyor::job_keys_internal {

// stage_timeout, checkpoints, recovery_timeout and lost servers.
void AddRecoveryKeys(Table& add) {
  add("stage_timeout", kNumber,
      "seconds a stage waits for a neighbour's tensor (or a stage's first answer) before the step fails with a "
      "message that names the action and the peer. A CUDA stage's first training step of a job waits at least 300 "
      "s: on a freshly started GPU host it may load CUDA's libraries and let cuDNN time every convolution")
      .Default("10")
      .Positive(1e7)
      .Expect("a number of seconds")
      .Set([](const V& v, S* s) { s->set_stage_timeout_s(v.number); })
      .Get([](const S& s) { return s.stage_timeout_s(); });
  add("checkpoint_every", kInt,
      "every K steps, and after the last one, each stage writes its parameters, buffers, optimizer state and RNG to "
      "its `--checkpoint-dir` (see [recovery.md](recovery.md)); 0: never. A stage server of replica 0 started "
      "without `--checkpoint-dir` refuses such a job when it is placed (FAILED_PRECONDITION naming the stage), "
      "before any training")
      .Default("0")
      .Range(0, 1e12)
      .Expect("a number of steps")
      .Set([](const V& v, S* s) { s->set_checkpoint_every(v.integer); })
      .Get([](const S& s) { return static_cast<double>(s.checkpoint_every()); });
  add("keep_checkpoints", kInt, "checkpoint files each stage keeps per job (the newest; at least 2)")
      .Default("3")
      .Range(2, 1000)
      .Set([](const V& v, S* s) { s->set_keep_checkpoints(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.keep_checkpoints(); });
  add("recovery_timeout", kNumber,
      "seconds to wait for a failed stage to answer again before the job fails naming it; 0: fail at the first "
      "stage failure. `conveyor submit --wait` waits as long for a coordinator it lost (a restarted coordinator "
      "resumes its jobs) before it gives up")
      .Default(std::to_string(static_cast<int>(kDefaultRecoveryTimeoutS)))
      .Range(0, 1e7)
      .Expect("a number of seconds")
      .Set([](const V& v, S* s) { s->set_recovery_timeout_s(v.number); })
      .Get([](const S& s) { return s.recovery_timeout_s(); });

  add("on_lost_server", kChoice,
      "what the job does when a stage server does not answer for `lost_after` seconds (lost for good: a host gone, "
      "its disk with it): `replan` goes on over the servers left, the lost stage's layers folded onto its "
      "neighbours (a stage server then holds several stages' layers, computing what they computed), from the newest "
      "checkpoint complete on every stage, read from the copies the other servers keep (`checkpoint_copies`); "
      "`fail` fails the job naming the server (see [recovery.md](recovery.md), \"A server lost for good\"). The "
      "interleaved and zbv schedules keep their chunks a server (interleaved goes on as 1f1b where its micro-batches "
      "no longer divide over the servers left). Of replicas, those that lost a server are dropped and the others "
      "take the global batch (where it splits evenly over them), zero 1's optimizer state sliced anew over them")
      .Choices(Names<v1::LostServerAction>({{"replan", v1::LOST_SERVER_REPLAN}, {"fail", v1::LOST_SERVER_FAIL}}))
      .Expect("replan or fail")
      .Default("replan")
      .Set([](const V& v, S* s) { s->set_on_lost_server(static_cast<v1::LostServerAction>(v.integer)); });
  add("lost_after", kNumber,
      "seconds a failed stage server may take to answer again before it counts as lost for good (`on_lost_server`); "
      "0: at once, at the first failure (a server that restarts in a second is then lost too). At most "
      "`recovery_timeout`")
      .DefaultDoc("recovery_timeout")
      .Range(0, 1e7)
      .Expect("a number of seconds")
      .Set([](const V& v, S* s) { s->set_lost_after_s(v.number); });
  add("checkpoint_copies", kInt,
      "copies of each checkpoint kept by another stage server of the job (the next one in the job's list), so that "
      "losing a server and its disk loses no checkpoint; each stage sends its file there after writing it (stage to "
      "stage, never through the coordinator), and that server needs a `--checkpoint-dir`. 0: none")
      .Default("1")
      .Range(0, 1)
      .Set([](const V& v, S* s) { s->set_checkpoint_copies(static_cast<int32_t>(v.integer)); });
  add("commit_steps", kBool,
      "replicas: each optimizer step waits for the coordinator's word that every stage of every replica reduced its "
      "gradients (a commit, as torchft's), so that a replica lost mid-step leaves the others whole at the step "
      "before; the job goes on from their state, redoing at most that step, not from its newest checkpoint (see "
      "[recovery.md](recovery.md)). Costs a round trip to the coordinator a step, and no step overlaps the next "
      "(`steps_in_flight`). Needs 2 or more `replicas`, and stage servers with a `--checkpoint-dir` (the state is "
      "written there as a checkpoint), also without `checkpoint_every`; not with `zero: 1` (a lost replica's slice "
      "of the optimizer state is on its servers alone)")
      .Default("false")
      .Set([](const V& v, S* s) { s->set_commit_steps(v.flag); });
}

}  // namespace conveyor::job_keys_internal
