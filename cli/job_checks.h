// What `conveyor train --reference` and `conveyor local` check of a job on
// this host before anything runs: a local cluster is started only for a job
// that would not fail on these at once.
#pragma once

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor::cli {

// `spec`'s paths already resolved (ResolveJobPaths, which also checked that
// its files exist). save.path must be a file this host may write
// (CheckSavePath: not a folder, a writable folder); data: {format: tensors}
// files (data.train, its shards, data.test) must be torch.save files
// (INVALID_ARGUMENT naming the key and what the file is, e.g. a CSV file).
Status CheckJobBeforeStart(const v1::JobSpec& spec);

}  // namespace conveyor::cli
