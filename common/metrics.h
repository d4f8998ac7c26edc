// Prometheus metrics of this process: one registry per process, every series'
// name, type, help and labels in one table (CONVEYOR_METRICS below), and the
// HTTP endpoint that a server's --metrics-listen starts.
//
// Built with prometheus-cpp (Debian's prometheus-cpp-dev) where CMake finds
// it; without it every update is a no-op, Text() is empty and
// MetricsEndpoint::Start refuses with FAILED_PRECONDITION saying so.
//
// Thread-safe: any thread may update any series at any time.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace conveyor::metrics {

// X(id, type, name, labels, help). Units and suffixes follow Prometheus's
// conventions: _seconds, _bytes, _total for counters. docs/operations.md
// lists the same table (a test checks every name appears there).
#define CONVEYOR_METRICS(X)                                                                                         \
  /* Both processes, from their start */                                                                          \
  X(kUp, kGauge, "conveyor_up", "role", "1 while this process serves (role: coordinator or stage)")                 \
  X(kBuildInfo, kGauge, "conveyor_build_info", "role,version", "1, labelled with this process's Conveyor version")   \
  /* The coordinator */                                                                                            \
  X(kJobs, kGauge, "conveyor_jobs", "state", "Jobs in the coordinator's database, by state")                       \
  X(kSteps, kCounter, "conveyor_steps_total", "job_id", "Training steps done (steps run again after a recovery count again)") \
  X(kStepSeconds, kHistogram, "conveyor_step_seconds", "job_id", "Wall time of a training step, as the coordinator waits for every stage") \
  X(kSamplesPerSecond, kGauge, "conveyor_samples_per_second", "job_id", "Training samples per second since the run started") \
  X(kTokensPerSecond, kGauge, "conveyor_tokens_per_second", "job_id", "Training tokens per second (token data and gpt only)") \
  X(kLoss, kGauge, "conveyor_loss", "job_id", "The last training step's loss")                                        \
  X(kLearningRate, kGauge, "conveyor_learning_rate", "job_id", "The learning rate of the last step")                 \
  X(kEvalLoss, kGauge, "conveyor_eval_loss", "job_id", "Mean loss over the test split at the last evaluation")        \
  X(kEvalAccuracy, kGauge, "conveyor_eval_accuracy", "job_id", "Accuracy over the test split at the last evaluation") \
  X(kCheckpoints, kCounter, "conveyor_checkpoints_total", "job_id", "Checkpoints complete on every stage")            \
  X(kRecoveries, kCounter, "conveyor_recoveries_total", "job_id", "Times a job recovered from a failed stage or link") \
  /* Both processes: the RPCs this process serves (method) that ended in an error (code) */                       \
  X(kRpcErrors, kCounter, "conveyor_rpc_errors_total", "method,code", "RPCs served that ended in an error, by status code") \
  /* The stage servers */                                                                                          \
  X(kStageSteps, kCounter, "conveyor_stage_steps_total", "job_id,stage,replica,phase", "Steps (train) and evaluation batches (eval) run by this stage") \
  X(kStageBusySeconds, kCounter, "conveyor_stage_busy_seconds_total", "job_id,stage,replica", "Forward, backward and optimizer time of this stage (on a GPU the device's)") \
  X(kStageIdleSeconds, kCounter, "conveyor_stage_idle_seconds_total", "job_id,stage,replica", "Step time of this stage not busy: waiting for neighbours, sending, the bubble") \
  X(kStageActivationPeakBytes, kGauge, "conveyor_stage_activation_peak_bytes", "job_id,stage,replica", "Most bytes of activations held at once in one step, over the job") \
  X(kStageDeviceMemoryBytes, kGauge, "conveyor_stage_device_memory_bytes", "stage,replica,device", "Memory in use: on a GPU what LibTorch's allocator reserved, on the CPU the process's resident set") \
  X(kStageSentBytes, kCounter, "conveyor_stage_sent_bytes_total", "job_id,stage,replica,peer,transport", "Tensor bytes sent to a neighbour (peer: upstream or downstream), by the link's transport") \
  X(kStageReceivedBytes, kCounter, "conveyor_stage_received_bytes_total", "job_id,stage,replica,peer,transport", "Tensor bytes received from a neighbour, by what carried them (grpc or nccl)") \
  X(kStageCheckpointSeconds, kHistogram, "conveyor_stage_checkpoint_seconds", "job_id,stage,replica", "Time to write one checkpoint file of this stage (write and sync)")

enum class Type { kCounter, kGauge, kHistogram };

enum class Id {
#define CONVEYOR_METRIC_ID(id, type, name, labels, help) id,
  CONVEYOR_METRICS(CONVEYOR_METRIC_ID)
#undef CONVEYOR_METRIC_ID
};

struct Definition {
  Id id;
  Type type;
  const char* name;
  const char* labels;  // comma-separated label names
  const char* help;
};
// Every series, in table order.
const std::vector<Definition>& Definitions();

// Label name to value; the names must be those of the series' definition.
using Labels = std::map<std::string, std::string>;

// Whether this build has prometheus-cpp (otherwise the rest does nothing).
bool Available();

// A counter grows by `value` (>= 0).
void Add(Id id, const Labels& labels, double value = 1);
// A gauge is set to `value`.
void Set(Id id, const Labels& labels, double value);
// A histogram observes `value`.
void Observe(Id id, const Labels& labels, double value);
// Drops the series of `id` whose labels include every pair in `match` (a job's
// gauges once it ended, say).
void Forget(Id id, const Labels& match);

// conveyor_up and conveyor_build_info of a server of `role` ("coordinator",
// "stage"): what an idle server serves before its first job.
void RecordProcess(const std::string& role);

// Counts an RPC served as `method` ("Service/Method") that ended in `status`
// (nothing when OK).
void CountRpcError(const std::string& method, const Status& status);

// Every series of this process in Prometheus's text format (empty without
// prometheus-cpp).
std::string Text();

// Serves Text() over HTTP at /metrics.
class MetricsEndpoint {
 public:
  // `address` is HOST:PORT (port 0 picks a free port); with `port_file` the
  // bound HOST:PORT is written there once serving. "" : no endpoint (null).
  // FAILED_PRECONDITION in a build without prometheus-cpp, UNAVAILABLE when
  // the address cannot be bound.
  static StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& address,
                                                          const std::string& port_file = "");
  virtual ~MetricsEndpoint() = default;
  // "host:port" with the port actually bound.
  virtual const std::string& address() const = 0;
};

}  // namespace conveyor::metrics
