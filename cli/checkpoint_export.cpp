#include "cli/checkpoint_export.h"

#include <sys/stat.h>
#include <torch/serialize/input-archive.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include "common/files.h"
#include "model/torchscript_export.h"
#include "plan/job_spec.h"
#include "plan/model_catalog.h"
#include "stage_server/checkpoint.h"

namespace conveyor::cli {
namespace {

bool IsDir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string Join(const std::vector<std::string>& words, const std::string& sep = ", ") {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : sep) + w;
  return out;
}

// Where a job's stage has checkpoint files of each step: the folders,
// those with its own files before those with a copy another server kept.
// After a re-plan one stage index has files of several cuts, in several
// folders.
using StageSteps = std::map<int, std::map<int64_t, std::vector<std::string>>>;

// The job that the folders hold: `wanted`, or the only one.
StatusOr<std::string> ChooseJob(const std::vector<std::string>& dirs, const std::string& wanted) {
  std::map<std::string, std::vector<std::string>> where;  // job -> folders
  for (const auto& dir : dirs) {
    for (const auto& job : ListDir(dir)) {
      if (IsDir(dir + "/" + job)) where[job].push_back(dir);
    }
  }
  if (!wanted.empty()) {
    if (!where.count(wanted))
      return absl::NotFoundError("no checkpoints of job " + wanted + " in " + Join(dirs));
    return wanted;
  }
  if (where.empty()) return absl::NotFoundError("no checkpoints in " + Join(dirs));
  if (where.size() > 1) {
    std::vector<std::string> said;
    for (const auto& [job, in] : where) said.push_back(job + " (in " + Join(in) + ")");
    return absl::InvalidArgumentError("the folders hold checkpoints of several jobs: " + Join(said, "; ") +
                                      "; say which with --job");
  }
  return where.begin()->first;
}

StatusOr<StageSteps> FindStages(const std::vector<std::string>& dirs, const std::string& job) {
  StageSteps stages;
  std::set<std::string> seen;
  for (int pass = 0; pass < 2; ++pass) {  // own files, then copies
    for (const auto& dir : dirs) {
      if (pass == 0 && !seen.insert(dir).second)
        return absl::InvalidArgumentError("--checkpoint-dir " + dir + " is given twice: give each stage server's once");
      for (const auto& name : ListDir(dir + "/" + job)) {
        int s = -1;
        char tail = 0;
        if (std::sscanf(name.c_str(), pass == 0 ? "stage-%d%c" : "copy-of-stage-%d%c", &s, &tail) != 1 || s < 0)
          continue;
        const CheckpointFiles files(dir);
        for (int64_t step : pass == 0 ? files.Steps(job, s) : files.CopySteps(job, s)) {
          auto& where = stages[s][step];
          if (std::find(where.begin(), where.end(), dir) == where.end()) where.push_back(dir);
        }
      }
    }
  }
  if (stages.empty()) return absl::NotFoundError("job " + job + " has no checkpoint files in " + Join(dirs));
  return stages;
}

// One stage's checkpoint of the step chosen.
struct StageCheckpoint {
  v1::CheckpointHeader header;
  std::string payload, path;
};

// The files of `step` under the cut that has one on each of its stages
// (after a re-plan a step may have been tried under several); empty where
// none has. `cut` receives the stage count of the newest file read.
StatusOr<std::vector<StageCheckpoint>> CompleteAt(const StageSteps& stages, const std::string& job, int64_t step,
                                                  int* cut) {
  std::map<int, std::map<int, StageCheckpoint>> by_cut;  // stages in the cut -> stage -> its file
  for (const auto& [s, steps] : stages) {
    auto it = steps.find(step);
    if (it == steps.end()) continue;
    for (const std::string& dir : it->second) {
      StageCheckpoint c;
      CONVEYOR_ASSIGN_OR_RETURN(std::string file, CheckpointFiles(dir).ReadFile(job, s, step, &c.header, &c.path));
      CONVEYOR_ASSIGN_OR_RETURN(c.payload, ParseCheckpoint(file, c.path, &c.header));
      const int n = c.header.spec().partition().stages();
      if (*cut == 0) *cut = n;
      by_cut[n].emplace(s, std::move(c));
    }
  }
  for (auto& [n, files] : by_cut) {
    if (static_cast<int>(files.size()) != n || files.rbegin()->first != n - 1) continue;
    std::vector<StageCheckpoint> out;
    for (auto& [s, c] : files) out.push_back(std::move(c));
    return out;
  }
  return std::vector<StageCheckpoint>();
}

// Why no step is complete: a stage no folder holds, or the steps each has.
Status NoCompleteStep(const StageSteps& stages, const std::string& job, int cut, int64_t wanted) {
  for (int s = 0; s < cut; ++s) {
    if (!stages.count(s))
      return absl::NotFoundError("job " + job + " has " + std::to_string(cut) + " stages, but no folder holds stage " +
                                 std::to_string(s) + "'s checkpoints: pass the --checkpoint-dir of every stage server");
  }
  std::vector<std::string> said;
  for (const auto& [s, steps] : stages) {
    std::vector<std::string> have;
    for (const auto& [step, dirs] : steps) have.push_back(std::to_string(step));
    said.push_back("stage " + std::to_string(s) + " has " + Join(have));
  }
  if (wanted > 0)
    return absl::NotFoundError("no cut of " + job + " has a checkpoint of step " + std::to_string(wanted) +
                               " on every stage: " + Join(said, "; "));
  return absl::FailedPreconditionError("no step has a checkpoint on every stage: " + Join(said, "; "));
}

// The newest step complete under one cut (or `wanted`, which must be).
StatusOr<std::vector<StageCheckpoint>> ChooseStep(const StageSteps& stages, const std::string& job, int64_t wanted,
                                                  int64_t* step) {
  std::set<int64_t> steps;
  for (const auto& [s, of] : stages)
    for (const auto& [k, dirs] : of) steps.insert(k);
  if (wanted > 0) steps = steps.count(wanted) ? std::set<int64_t>{wanted} : std::set<int64_t>{};
  int cut = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    CONVEYOR_ASSIGN_OR_RETURN(std::vector<StageCheckpoint> files, CompleteAt(stages, job, *it, &cut));
    if (files.empty()) continue;
    *step = *it;
    return files;
  }
  return NoCompleteStep(stages, job, cut, wanted);
}

// Every layer of the model in exactly one stage's chunks.
Status CheckLayers(const std::vector<v1::CheckpointHeader>& headers) {
  const int n = NumLayers(headers.front().spec().model());
  std::vector<int> owner(static_cast<std::size_t>(n), -1);
  for (const auto& h : headers) {
    for (const auto& c : h.chunks()) {
      for (int l = c.layer_begin(); l < c.layer_end(); ++l) {
        if (l < 0 || l >= n)
          return absl::FailedPreconditionError("stage " + std::to_string(h.stage_index()) + " holds layer " +
                                               std::to_string(l) + ", but the model has " + std::to_string(n));
        int& o = owner[static_cast<std::size_t>(l)];
        if (o >= 0)
          return absl::FailedPreconditionError("layer " + std::to_string(l) + " is in the checkpoints of stage " +
                                               std::to_string(o) + " and of stage " +
                                               std::to_string(h.stage_index()));
        o = h.stage_index();
      }
    }
  }
  for (int l = 0; l < n; ++l) {
    if (owner[static_cast<std::size_t>(l)] < 0)
      return absl::NotFoundError("layer " + std::to_string(l) + " is in no stage's checkpoint: pass the "
                                 "--checkpoint-dir of every stage server");
  }
  return absl::OkStatus();
}

// A stage's parameters and buffers from its checkpoint payload.
StatusOr<NamedTensors> ReadWeights(const std::string& payload, const v1::CheckpointHeader& header,
                                   const std::string& path) {
  NamedTensors out;
  try {
    torch::serialize::InputArchive archive;
    std::istringstream in(payload);
    archive.load_from(in, c10::Device(c10::kCPU));
    for (int i = 0; i < header.parameter_names_size(); ++i) {
      at::Tensor t;
      archive.read("p" + std::to_string(i), t);
      out.emplace_back(header.parameter_names(i), t);
    }
    for (int j = 0; j < header.buffer_names_size(); ++j) {
      at::Tensor t;
      archive.read("b" + std::to_string(j), t, /*is_buffer=*/true);
      out.emplace_back(header.buffer_names(j), t);
    }
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    return absl::DataLossError("checkpoint " + path + " cannot be read: " + what.substr(0, what.find('\n')));
  }
  return out;
}

}  // namespace

StatusOr<CheckpointExportSummary> ExportCheckpoints(const CheckpointExportOptions& options) {
  if (options.dirs.empty()) return absl::InvalidArgumentError("--checkpoint-dir: none given");
  for (const auto& dir : options.dirs) {
    if (!IsDir(dir)) return absl::NotFoundError("--checkpoint-dir " + dir + " is not a folder");
  }
  CheckpointExportSummary summary;
  CONVEYOR_ASSIGN_OR_RETURN(summary.job_id, ChooseJob(options.dirs, options.job_id));
  CONVEYOR_ASSIGN_OR_RETURN(auto stages, FindStages(options.dirs, summary.job_id));
  CONVEYOR_ASSIGN_OR_RETURN(std::vector<StageCheckpoint> files,
                            ChooseStep(stages, summary.job_id, options.step, &summary.step));
  std::vector<v1::CheckpointHeader> headers;
  for (const StageCheckpoint& c : files) {
    if (!c.header.has_spec())
      return absl::FailedPreconditionError("checkpoint " + c.path +
                                           " was written before checkpoints carried the parameters' names: "
                                           "export it from the running job (conveyor export JOB)");
    if (c.header.spec_digest() != files.front().header.spec_digest())
      return absl::FailedPreconditionError("the checkpoints of " + summary.job_id + " in " + files.front().path +
                                           " and " + c.path + " were written for different job specs");
    headers.push_back(c.header);
  }
  const v1::JobSpec& spec = headers.front().spec();
  CONVEYOR_RETURN_IF_ERROR(CheckLayers(headers));
  NamedTensors weights;
  for (std::size_t i = 0; i < headers.size(); ++i) {
    CONVEYOR_ASSIGN_OR_RETURN(NamedTensors mine, ReadWeights(files[i].payload, headers[i], files[i].path));
    for (auto& [name, t] : mine) {
      summary.bytes += t.numel() * static_cast<int64_t>(t.element_size());
      weights.emplace_back(std::move(name), std::move(t));
    }
  }
  summary.stages = static_cast<int>(headers.size());
  summary.tensors = static_cast<int64_t>(weights.size());
  CONVEYOR_RETURN_IF_ERROR(WriteWeights(options.out, weights, spec.model(), options.format == "torchscript", "--out"));
  return summary;
}

}  // namespace conveyor::cli
