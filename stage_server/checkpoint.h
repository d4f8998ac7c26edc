// A stage's checkpoint files, torch-free: where they live, their layout, the
// atomic write, the checks on load, and which old ones to delete.
//
// One file per (job, stage, step) under the stage's --checkpoint-dir:
//   <dir>/<job id>/stage-<s>/step-<12 digits>.ckpt
// and, on the server that keeps copies of stage s's files (so that losing a
// server, disk included, loses no checkpoint):
//   <dir>/<job id>/copy-of-stage-<s>/step-<12 digits>.ckpt
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
  // Steps of the copies of this job's and stage's files that it keeps.
  std::vector<int64_t> CopySteps(const std::string& job_id, int stage) const;

  // The whole file of (job, stage, step), this server's own or its copy,
  // checked as Load checks it; `header` filled. NOT_FOUND where it has
  // neither. `path` (optional) receives where it was.
  StatusOr<std::string> ReadFile(const std::string& job_id, int stage, int64_t step, v1::CheckpointHeader* header,
                                 std::string* path = nullptr) const;

  // A part of that file as a peer reads it (ReadCheckpointFile): bytes from
  // req.offset, at most req.max_bytes (0: kCheckpointPartBytes), or with
  // header_only its header alone. Unchecked: the reader checks the whole.
  StatusOr<v1::CheckpointFilePart> ReadPart(const v1::CheckpointFileRequest& req) const;

  // Writes a part of another server's checkpoint file as this server's copy
  // of it; the part at offset 0 starts the file anew. Once the last part is
  // in, the whole is checked (checksum, job, stage, step), made durable under
  // its final name, and copies older than the newest part.keep() are
  // deleted. Parts come in order from one writer per (job, stage).
  Status WriteCopyPart(const v1::CheckpointFilePart& part);

 private:
  std::string CopyPathFor(const std::string& job_id, int stage, int64_t step) const;

  std::string dir_;
};

// The most bytes one ReadCheckpointFile or WriteCheckpointCopy carries.
constexpr int64_t kCheckpointPartBytes = 4 << 20;

// Parses a whole checkpoint file; the same checks as Load. Exposed for tests
// and the fuzz target.
StatusOr<std::string> ParseCheckpoint(const std::string& file, const std::string& path, v1::CheckpointHeader* header);

}  // namespace conveyor
