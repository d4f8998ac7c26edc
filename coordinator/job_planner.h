// Job planning: turns a job's spec and its stages into what each stage is
// told. Once per job, before any stage is configured: every stage must answer,
// stage 0 describes the model and data files, the partition is balanced, each
// chunk's shapes are probed along the chain on the stage that will hold it.
// Each time the job is deployed: which transport each link uses.
//
// Free functions over StageClients (not owned; thread-safe, so these may run
// on any thread); they keep no state between calls.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"
#include "coordinator/stage_client.h"

namespace conveyor {

// Completes `spec` (a TorchScript model's layers and a data file's shapes
// from stage 0; partition.balance params or time: the boundaries, profiled on
// stage 0) and returns every stage's assignment, in stage order.
// REQUIRES: stages.size() == spec->partition().stages(). `job_id` names the
// job in the assignments and in log lines. On failure `spec` may be partly
// completed (what a later call then skips).
StatusOr<std::vector<v1::StageAssignment>> PlanJob(const std::string& job_id, const std::vector<StageClient*>& stages,
                                                   v1::JobSpec* spec);

// Every stage's info, asked in order within `timeout_s`; the first that does
// not answer is the error (at once for a refused connection).
StatusOr<std::vector<v1::StageInfo>> InfoAll(const std::vector<StageClient*>& stages, double timeout_s);

// Decides each link's transport from spec.transport and the stages (CUDA
// device, NCCL built in) and has the upstream end of every NCCL link make its
// ids. Returns, per stage, the setup of the link from its upstream neighbour.
// `ring`: the last stage feeds the first (interleaved schedule).
// FAILED_PRECONDITION naming the link for transport: nccl on a link that
// cannot use it.
StatusOr<std::vector<v1::LinkSetup>> PlanLinks(const std::string& job_id, const v1::JobSpec& spec,
                                               const std::vector<StageClient*>& stages, bool ring);

// replicas: what the copies of each stage sum their gradients with, from
// spec.collectives and the servers: `infos` and `addresses` hold replica k's
// stage s at k * p + s. NCCL where every pair of a stage's copies could be
// linked by NCCL (WhyNotNccl), else Gloo; FAILED_PRECONDITION naming the
// stage for collectives: nccl where they cannot. One kind per stage index.
StatusOr<std::vector<v1::CollectiveKind>> PlanCollectives(const v1::JobSpec& spec, std::vector<v1::StageInfo> infos,
                                                          const std::vector<std::string>& addresses, int p);

// Why the link between stages `a` and `b` (their infos and addresses) cannot
// use NCCL, or "" when it can: both must be CUDA devices of servers built
// with NCCL, on different GPUs. Two stages are on one GPU when their GPU
// UUIDs are equal, or, where a server does not report one, when they have
// the same host and device name.
std::string WhyNotNccl(const v1::StageInfo& a, const std::string& address_a, const v1::StageInfo& b,
                       const std::string& address_b);

// The host part of a stage's address ("10.0.0.5:7000" -> "10.0.0.5",
// "[::1]:7000" -> "::1", "dns:///node3:7000" -> "node3"); 127.0.0.1 for an
// in-process one. Where a replica's group listens and its store is found.
std::string HostOf(const std::string& address);

}  // namespace conveyor
