// A stage server's Prometheus series (common/metrics.h), from the stage
// server process itself: steps, busy and idle time, activation and device
// memory after each step; bytes sent per link through a TransportFactory that
// wraps the real one (bytes received are counted by the Inbox).
//
// Torch-free header. Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "common/metrics.h"
#include "conveyor.pb.h"
#include "transport/transport.h"

namespace conveyor {

// The labels of a stage's series: job, stage, replica (the copy of the
// pipeline; 0 without replicas).
metrics::Labels StageLabels(const std::string& job_id, int stage_index, int replica);

// After a step that succeeded on stage `stage_index` of copy `replica`, on
// `device`.
void RecordStageStep(int stage_index, int replica, const std::string& device, const v1::RunStepRequest& req,
                     const v1::RunStepReply& reply);

// A stage server without a job (started, or its job released): conveyor_up
// and conveyor_build_info, and the device's memory in use with empty stage
// and replica labels (replaced by the job's series at its first step).
void RecordIdleStage(const std::string& device);

// Bytes of memory in use on `device`: on a GPU what LibTorch's caching
// allocator reserved, on the CPU this process's resident set. -1: unknown.
int64_t DeviceMemoryBytes(const std::string& device);

// Makes the links of `inner` (not owned, outlives this) and counts the bytes
// each sends in conveyor_stage_sent_bytes_total.
std::unique_ptr<TransportFactory> CountingTransports(TransportFactory* inner);

}  // namespace conveyor
