// The job keys of the batch and the schedule: batch size, replicas and how
// their gradients are summed, micro-batches, the schedule, recomputation.
#include "plan/job_key_rows.h"

#include <yaml-cpp/yaml.h>

#include <limits>
#include <string>

#include "plan/job_spec.h"

namespace conveyor::job_keys_internal {
namespace {

Status ReadRecompute(const YAML::Node& node, S* s) {
  if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i) {
      int64_t stage = 0;
      if (!ReadScalar(node[i], &stage) || stage < 0 || stage > std::numeric_limits<int32_t>::max())
        return Invalid("recompute: item " + std::to_string(i) + ": expected a stage index, got " + Show(node[i]));
      s->add_recompute_stages(static_cast<int32_t>(stage));
    }
    return absl::OkStatus();
  }
  bool on = false;
  if (!ReadScalar(node, &on))
    return Invalid("recompute: expected true, false or a list of stage indices, got " + Show(node));
  s->set_recompute(on);
  return absl::OkStatus();
}

}  // namespace

// the batch, replicas, micro-batches and the schedule.
void AddScheduleKeys(Table& add) {
  add("batch_size", kInt, "samples per optimizer step")
      .Default("32")
      .Range(1, 1000000)
      .Set([](const V& v, S* s) { s->set_batch_size(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.batch_size(); });
  add("replicas", kInt,
      "copies of the pipeline trained side by side on R × P stage servers, each on its share of every batch, "
      "their gradients all-reduced before the optimizer step (see [parallelism.md](parallelism.md))")
      .Default("1")
      .Range(1, 4096)
      .Set([](const V& v, S* s) { s->set_replicas(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.replicas(); });
  add("bucket_cap_mb", kNumber,
      "replicas: the gradients are all-reduced in buckets of at most this many MiB, each started as soon as its "
      "gradients are final in the step's last backward pass, as DDP's `bucket_cap_mb` (see "
      "[parallelism.md](parallelism.md))")
      .Default("25")
      .Range(0.001, 1e6)
      .Set([](const V& v, S* s) { s->set_bucket_cap_mb(v.number); })
      .Get([](const S& s) { return BucketCapMb(s); });
  add("zero", kInt,
      "replicas: the ZeRO stage. `1` shards each stage's optimizer state over its R copies, as DeepSpeed's ZeRO-1: "
      "the gradients are reduce-scattered, each copy updates its 1/R slice of every gradient bucket with its share "
      "of the state, and the parameters are all-gathered (the bytes of one all-reduce): the state takes 1/R of the "
      "memory; `0` keeps all of it on every copy. No effect with one replica (see [parallelism.md](parallelism.md))")
      .Default("0")
      .Range(0, 1)
      .Set([](const V& v, S* s) { s->set_zero_stage(static_cast<int32_t>(v.integer)); });
  add("collectives", kChoice,
      "replicas: how the copies of each stage sum their gradients: `auto` (NCCL on the devices where every copy of "
      "the stage is on a GPU of its own in a stage server built with NCCL, else Gloo), `nccl` (a stage whose copies "
      "cannot use NCCL fails the job with FAILED_PRECONDITION naming it) or `gloo` (c10d's Gloo group, through host "
      "memory). `conveyor status --json` names each stage's (see [parallelism.md](parallelism.md))")
      .Choices(Names<v1::CollectiveKind>(
          {{"auto", v1::COLLECTIVES_AUTO}, {"nccl", v1::COLLECTIVES_NCCL}, {"gloo", v1::COLLECTIVES_GLOO}}))
      .Expect("auto, nccl or gloo")
      .Default("auto")
      .Set([](const V& v, S* s) { s->set_collectives(static_cast<v1::CollectiveKind>(v.integer)); });
  add("micro_batches", kInt, "micro-batches per step (near-equal sizes, as `torch.tensor_split`)")
      .DefaultDoc("1")
      .Range(1, 1000000)
      .Set([](const V& v, S* s) { s->set_micro_batches(static_cast<int32_t>(v.integer)); });
  add("split_size", kInt,
      "instead of `micro_batches`: samples per micro-batch, the last one smaller (the seed tutorial's knob)")
      .Range(1, 1000000)
      .Set([](const V& v, S* s) { s->set_split_size(static_cast<int32_t>(v.integer)); });
  add("schedule", kChoice,
      "`gpipe`, `1f1b`, `interleaved`, `zero-bubble` or `zbv` (two chunks a stage in a V, backward split as in "
      "zero-bubble); see [schedules.md](schedules.md)")
      .Choices(Names<v1::ScheduleKind>({{"gpipe", v1::SCHEDULE_GPIPE},
                                        {"1f1b", v1::SCHEDULE_1F1B},
                                        {"interleaved", v1::SCHEDULE_INTERLEAVED},
                                        {"zero-bubble", v1::SCHEDULE_ZERO_BUBBLE},
                                        {"zbv", v1::SCHEDULE_ZBV}}))
      .Expect("a schedule name")
      .Default("gpipe")
      .Set([](const V& v, S* s) { s->set_schedule(static_cast<v1::ScheduleKind>(v.integer)); });
  add("virtual_stages", kInt,
      "interleaved: model chunks per stage (2 or more; micro-batches a multiple of the stages); zbv: 2, its default")
      .Default("1")
      .Range(1, 64)
      .Set([](const V& v, S* s) { s->set_virtual_stages(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.virtual_stages(); });
  add("recompute", KeyType::kCustom,
      "`true`, or a list of stage indices: keep only each micro-batch's input and recompute the forward in backward "
      "(the same dropout masks; buffers such as BatchNorm's running statistics are updated by the first forward only)")
      .Expect("true, false or a list of stage indices")
      .DefaultDoc("false")
      .Read(ReadRecompute);
}

}  // namespace conveyor::job_keys_internal
