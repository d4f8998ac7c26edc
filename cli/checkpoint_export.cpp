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

// Where one stage's checkpoints of the job are.
struct StageFiles {
  std::string dir;
  std::vector<int64_t> steps;
};

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

// Stage index -> its folder and steps, for the stage-<s> folders of `job`.
StatusOr<std::map<int, StageFiles>> FindStages(const std::vector<std::string>& dirs, const std::string& job) {
  std::map<int, StageFiles> stages;
  for (const auto& dir : dirs) {
    for (const auto& name : ListDir(dir + "/" + job)) {
      int s = -1;
      char tail = 0;
      if (std::sscanf(name.c_str(), "stage-%d%c", &s, &tail) != 1 || s < 0) continue;
      std::vector<int64_t> steps = CheckpointFiles(dir).Steps(job, s);
      if (steps.empty()) continue;
      auto [it, fresh] = stages.emplace(s, StageFiles{dir, steps});
      if (!fresh)
        return absl::InvalidArgumentError("stage " + std::to_string(s) + " of job " + job + " has checkpoints in " +
                                          it->second.dir + " and in " + dir +
                                          ": give the --checkpoint-dir of each stage server once");
    }
  }
  if (stages.empty()) return absl::NotFoundError("job " + job + " has no checkpoint files in " + Join(dirs));
  return stages;
}

// The newest step every stage has (or `wanted`, which every stage must have).
StatusOr<int64_t> ChooseStep(const std::map<int, StageFiles>& stages, int64_t wanted) {
  std::set<int64_t> common(stages.begin()->second.steps.begin(), stages.begin()->second.steps.end());
  for (const auto& [s, files] : stages) {
    std::set<int64_t> mine(files.steps.begin(), files.steps.end());
    if (wanted > 0 && !mine.count(wanted))
      return absl::NotFoundError("stage " + std::to_string(s) + " has no checkpoint of step " +
                                 std::to_string(wanted) + " in " + files.dir);
    std::set<int64_t> both;
    std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(), std::inserter(both, both.end()));
    common = std::move(both);
  }
  if (wanted > 0) return wanted;
  if (common.empty()) {
    std::vector<std::string> said;
    for (const auto& [s, files] : stages) {
      std::vector<std::string> steps;
      for (int64_t step : files.steps) steps.push_back(std::to_string(step));
      said.push_back("stage " + std::to_string(s) + " has " + Join(steps));
    }
    return absl::FailedPreconditionError("no step has a checkpoint on every stage: " + Join(said, "; "));
  }
  return *common.rbegin();
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
  CONVEYOR_ASSIGN_OR_RETURN(summary.step, ChooseStep(stages, options.step));

  std::vector<v1::CheckpointHeader> headers;
  std::vector<std::string> payloads, paths;
  for (const auto& [s, files] : stages) {
    v1::CheckpointHeader header;
    v1::CheckpointRecord record;
    CONVEYOR_ASSIGN_OR_RETURN(std::string payload,
                              CheckpointFiles(files.dir).Load(summary.job_id, s, summary.step, &header, &record));
    if (!header.has_spec())
      return absl::FailedPreconditionError("checkpoint " + record.path() +
                                           " was written before checkpoints carried the parameters' names: "
                                           "export it from the running job (conveyor export JOB)");
    if (!headers.empty() && header.spec_digest() != headers.front().spec_digest())
      return absl::FailedPreconditionError("the checkpoints of " + summary.job_id + " in " + paths.front() + " and " +
                                           record.path() + " were written for different job specs");
    headers.push_back(std::move(header));
    payloads.push_back(std::move(payload));
    paths.push_back(record.path());
  }
  const v1::JobSpec& spec = headers.front().spec();
  const int want = spec.partition().stages();
  for (int s = 0; s < want; ++s) {
    if (!stages.count(s))
      return absl::NotFoundError("job " + summary.job_id + " has " + std::to_string(want) + " stages, but no folder " +
                                 "holds stage " + std::to_string(s) + "'s checkpoints: pass the --checkpoint-dir of "
                                 "every stage server");
  }
  if (static_cast<int>(stages.size()) != want)
    return absl::FailedPreconditionError("job " + summary.job_id + " has " + std::to_string(want) +
                                         " stages, the folders hold checkpoints of " + std::to_string(stages.size()));
  CONVEYOR_RETURN_IF_ERROR(CheckLayers(headers));
  NamedTensors weights;
  for (std::size_t i = 0; i < headers.size(); ++i) {
    CONVEYOR_ASSIGN_OR_RETURN(NamedTensors mine, ReadWeights(payloads[i], headers[i], paths[i]));
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
