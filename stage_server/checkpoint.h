// A stage's checkpoint files, torch-free: where they live, their layout, the
// atomic write, the checks on load, and which old ones to delete.
//
// One file per (job, stage, step) under the stage's --checkpoint-dir:
//   <dir>/<job id>/stage-<s>/step-<12 digits>.ckpt
// Layout:
//   "CVYCKPT1" | header length, 4 bytes little-endian | v1::CheckpointHeader |
//   payload (header.payload_bytes: a LibTorch archive of parameters, buffers,
//   optimizer state and RNG) | SHA-256 of everything before it, 32 bytes.
// The write goes to a temporary file, is fsynced and renamed into place, so a
// crash leaves the old checkpoints intact and never a half-written one under
// the final name; a file damaged later is caught by the checksum.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

class CheckpointFiles {
 public:
  // `dir` empty: this stage cannot write checkpoints (Save and Load fail with
  // FAILED_PRECONDITION).
  explicit CheckpointFiles(std::string dir) : dir_(std::move(dir)) {}

  const std::string& dir() const { return dir_; }
  std::string PathFor(const std::string& job_id, int stage, int64_t step) const;

  // Writes header + payload durably, then deletes this job's and stage's
  // checkpoints older than the newest `keep`.
  StatusOr<v1::CheckpointRecord> Save(v1::CheckpointHeader header, const std::string& payload, int keep);

  // Reads and checks the file of (job, stage, step): NOT_FOUND when there is
  // none, DATA_LOSS when it is truncated or its checksum does not match,
  // FAILED_PRECONDITION when it belongs to another job or stage. Returns the
  // payload and fills `header`.
  StatusOr<std::string> Load(const std::string& job_id, int stage, int64_t step, v1::CheckpointHeader* header,
                             v1::CheckpointRecord* record) const;

  // Steps of this job's and stage's checkpoint files, oldest first.
  std::vector<int64_t> Steps(const std::string& job_id, int stage) const;

 private:
  std::string dir_;
};

// Parses a whole checkpoint file; the same checks as Load. Exposed for tests
// and the fuzz target.
StatusOr<std::string> ParseCheckpoint(const std::string& file, const std::string& path, v1::CheckpointHeader* header);

}  // namespace conveyor
