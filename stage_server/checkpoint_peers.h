// Checkpoint files on other stage servers, torch-free: the copy of each
// checkpoint that a stage sends to the server that keeps it, and the files a
// stage reads from its peers when it loads a checkpoint written under another
// cut of the model, or one whose server was lost (docs/recovery.md, "A server
// lost for good"). Stage to stage over StageControl's ReadCheckpointFile and
// WriteCheckpointCopy, in parts of kCheckpointPartBytes; never through the
// coordinator.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor {

// Which checkpoint file: a job's stage's file of a step.
struct CheckpointFileId {
  std::string job_id;
  int stage = 0;
  int64_t step = 0;
  std::string Describe() const;  // "job-3 stage 1 step 20"
};

// Sends `file` (a whole checkpoint file) to the stage server at `address`,
// which keeps it as its copy of `id` and keeps `keep` such copies.
Status SendCheckpointCopy(const std::string& address, const CheckpointFileId& id, const std::string& file, int keep,
                          double timeout_s);

// The header of `id`'s file from the first of `peers` that holds one that
// `fits` (its own file or a copy; a file left by an attempt under another
// cut does not); `holder` receives that peer. NOT_FOUND naming the peers
// where none does, UNAVAILABLE where some could not be asked and the others
// have none.
StatusOr<v1::CheckpointHeader> PeerCheckpointHeader(const std::vector<std::string>& peers, const CheckpointFileId& id,
                                                    double timeout_s, std::string* holder,
                                                    const std::function<bool(const v1::CheckpointHeader&)>& fits);

// The whole file of `id` from `holder`, unchecked (ParseCheckpoint checks it).
StatusOr<std::string> PeerCheckpointFile(const std::string& holder, const CheckpointFileId& id, double timeout_s);

}  // namespace conveyor
