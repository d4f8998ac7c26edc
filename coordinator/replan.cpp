// JobRunner's layout when servers are lost for good (see job_runner.h and
// docs/recovery.md, "A server lost for good"): where each checkpoint's copy
// goes, the re-plan onto the servers left (the cut folded, or a replica
// dropped), and the way back to the planned layout once they answer again.
#include "coordinator/job_runner.h"

#include <algorithm>
#include <functional>
#include <set>

#include "common/logging.h"
#include "coordinator/job_planner.h"
#include "plan/job_spec.h"
#include "plan/model_catalog.h"
#include "plan/placement.h"

namespace conveyor {

Status JobRunner::PlanCopies() {
  const std::size_t n = stages_.size();
  if (spec_.checkpoint_every() == 0 || CheckpointCopies(spec_) == 0 || n < 2) return absl::OkStatus();
  CONVEYOR_ASSIGN_OR_RETURN(std::vector<v1::StageInfo> infos, InfoAll(stages_, spec_.stage_timeout_s()));
  const std::size_t p = static_cast<std::size_t>(spec_.partition().stages());
  for (std::size_t i = 0; i < p; ++i) {  // replica 0's stages write the checkpoints
    for (std::size_t k = 1; k < n; ++k) {
      const std::size_t to = (i + k) % n;
      if (!infos[to].checkpoint_dir()) continue;
      assignments_[i].set_checkpoint_copy_to(stages_[to]->address());
      break;
    }
    if (assignments_[i].checkpoint_copy_to().empty()) {
      Event("no other stage server of the job has a --checkpoint-dir: stage " + std::to_string(i) +
            "'s checkpoints have no copy, and are lost with its server");
    }
  }
  return absl::OkStatus();
}

bool JobRunner::PlannedServersAnswer() {
  for (StageClient* s : planned_stages_) {
    if (std::find(stages_.begin(), stages_.end(), s) != stages_.end()) continue;
    auto info = s->GetInfo(0.25);
    if (!info.ok() || (!info->job_id().empty() && info->job_id() != status_.job_id())) return false;
  }
  return true;
}

void JobRunner::GrowBack() {
  std::string back;
  for (StageClient* s : planned_stages_) {
    if (std::find(stages_.begin(), stages_.end(), s) != stages_.end()) continue;
    back += (back.empty() ? "" : ", ") + s->address();
  }
  const int from = spec_.partition().stages();
  stages_ = planned_stages_;
  *spec_.mutable_partition() = planned_spec_.partition();
  spec_.set_replicas(planned_spec_.replicas());
  spec_.set_commit_steps(planned_spec_.commit_steps());
  *spec_.mutable_recompute_stages() = planned_spec_.recompute_stages();
  spec_.set_schedule(planned_spec_.schedule());
  spec_.set_virtual_stages(planned_spec_.virtual_stages());
  status_.clear_lost_servers();
  const std::string text = "stage server(s) " + back + " answer again: the job returns from " + std::to_string(from) +
                           " to its planned " + std::to_string(spec_.partition().stages()) +
                           " stage servers at the checkpoint of step " + std::to_string(status_.checkpoint_step());
  LOG_INFO("job ", status_.job_id(), ": ", text);
  Event(text);
}

std::string JobRunner::WhyNoReplan() const {
  if (stages_.size() < 2) return "it has no other server";
  return "";
}

Status JobRunner::DropReplica(const std::vector<std::size_t>& lost) {
  const std::size_t p = static_cast<std::size_t>(spec_.partition().stages());
  std::set<std::size_t> hit;
  std::string gone;
  for (std::size_t s : lost) {
    hit.insert(s / p);
    gone += (gone.empty() ? "" : ", ") + StageName(s) + " at " + stages_[s]->address();
  }
  const int replicas = Replicas(spec_);
  if (static_cast<int>(hit.size()) >= replicas) {
    return absl::UnavailableError("every replica of the job lost a stage server (" + gone +
                                  "): no whole pipeline is left to go on with");
  }
  std::vector<StageClient*> kept;
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    if (!hit.count(s / p)) {
      kept.push_back(stages_[s]);
      continue;
    }
    if (std::find(lost.begin(), lost.end(), s) == lost.end()) continue;  // alive, dropped with its replica
    status_.add_lost_servers(stages_[s]->address());
    holders_.erase(std::remove(holders_.begin(), holders_.end(), stages_[s]->address()), holders_.end());
  }
  const int left = replicas - static_cast<int>(hit.size());
  v1::JobSpec smaller = spec_;
  smaller.set_replicas(left);
  if (left < 2) smaller.clear_commit_steps();  // nothing left to commit across
  if (Status st = ValidateJobSpec(smaller); !st.ok()) {
    return absl::FailedPreconditionError("lost for good: " + gone + "; the job cannot go on as " +
                                         std::to_string(left) + " replica(s): " + std::string(st.message()));
  }
  spec_ = std::move(smaller);
  stages_ = std::move(kept);
  const std::string text = "lost for good (no answer within lost_after, " +
                           std::to_string(static_cast<int>(LostAfterS(spec_))) + " s): " + gone +
                           "; the job goes on as " + std::to_string(left) + " replica(s) of " + std::to_string(p) +
                           " stages, each step still over the global batch of " +
                           std::to_string(spec_.batch_size()) + ", from its newest complete checkpoint" +
                           (planned_spec_.commit_steps() ? ""
                                                         : " (the steps since are redone; commit_steps: true keeps "
                                                           "them, redoing the step that failed alone)");
  LOG_WARN("job ", status_.job_id(), ": ", text);
  Event(text);
  return absl::OkStatus();
}

void JobRunner::KeepReplicaState(const std::set<std::size_t>& hit) {
  const std::size_t p = static_cast<std::size_t>(spec_.partition().stages());
  std::size_t keep = 0;
  while (hit.count(keep)) ++keep;
  if (keep * p >= stages_.size()) return;
  std::vector<StatusOr<v1::CheckpointRecord>> records(p, absl::UnknownError("not called"));
  std::vector<std::function<void()>> calls;
  const v1::JobRef ref = Ref();
  for (std::size_t i = 0; i < p; ++i) {
    calls.push_back([&, i] { records[i] = stages_[keep * p + i]->SaveState(ref, kControlDeadlineS); });
  }
  pool_.RunAll(calls);
  std::string why;
  std::vector<v1::RunStepReply> replies(p);
  for (std::size_t i = 0; i < p && why.empty(); ++i) {
    if (!records[i].ok()) {
      why = std::string(records[i].status().message());
    } else if (records[i]->step() != records[0]->step()) {
      why = "its stages hold steps " + std::to_string(records[0]->step()) + " and " + std::to_string(records[i]->step());
    } else {
      *replies[i].mutable_checkpoint() = *records[i];
    }
  }
  if (why.empty() && records[0]->step() < status_.checkpoint_step()) why = "it is older than the newest checkpoint";
  if (!why.empty()) {
    Event("the state of replica " + std::to_string(keep) + " cannot be kept (" + why +
          "): the job goes on from its newest complete checkpoint");
    return;
  }
  RecordCheckpoint(records[0]->step(), replies);
  // That state is on the servers that wrote it alone: the next step's
  // checkpoint sends its copies.
  checkpoint_next_ = spec_.checkpoint_every() > 0 && CheckpointCopies(spec_) > 0;
  Event("replica " + std::to_string(keep) + " kept its state after step " + std::to_string(records[0]->step()) +
        " (commit_steps): the job goes on from it" +
        (checkpoint_next_ ? ", with a checkpoint at its next step for a copy on another server" : ""));
}

Status JobRunner::Replan(const std::vector<std::size_t>& lost) {
  if (Replicas(spec_) > 1) return DropReplica(lost);
  std::vector<StageClient*> kept;
  std::string gone;
  for (std::size_t s = 0; s < stages_.size(); ++s) {
    if (std::find(lost.begin(), lost.end(), s) == lost.end()) {
      kept.push_back(stages_[s]);
      continue;
    }
    status_.add_lost_servers(stages_[s]->address());
    holders_.erase(std::remove(holders_.begin(), holders_.end(), stages_[s]->address()), holders_.end());
    gone += (gone.empty() ? "" : ", ") + StageName(s) + " at " + stages_[s]->address();
  }
  auto fold = FoldOntoServers(spec_, static_cast<int>(kept.size()));
  if (!fold.ok()) return absl::FailedPreconditionError("lost for good: " + gone + "; " + std::string(fold.status().message()));
  spec_ = std::move(fold->spec);
  stages_ = std::move(kept);
  const std::string text = "lost for good (no answer within lost_after, " +
                           std::to_string(static_cast<int>(LostAfterS(spec_))) + " s): " + gone +
                           "; the job goes on over " + std::to_string(stages_.size()) + " stage server(s), cut at [" +
                           fold->cut + "]" + (fold->changed.empty() ? "" : " (" + fold->changed + ")") +
                           ", from its newest complete checkpoint";
  LOG_WARN("job ", status_.job_id(), ": ", text);
  Event(text);
  return absl::OkStatus();
}

}  // namespace conveyor
