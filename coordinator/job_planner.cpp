#include "coordinator/job_planner.h"

#include <algorithm>

#include "common/logging.h"
#include "plan/job_spec.h"
#include "plan/model_catalog.h"
#include "plan/schedule.h"

namespace conveyor {
namespace {

// partition.balance params or time: profiles the model on stage 0 and sets
// the boundaries that make the costliest chunk as cheap as possible.
Status BalancePartition(const std::string& job_id, StageClient* stage0, v1::JobSpec* spec) {
  v1::PartitionSpec* part = spec->mutable_partition();
  const int chunks = part->stages() * std::max(1, spec->virtual_stages());
  if (part->boundaries_size() > 0 || chunks == 1 ||
      (part->balance() != v1::BALANCE_PARAMS && part->balance() != v1::BALANCE_TIME)) {
    return absl::OkStatus();
  }
  v1::ProfileRequest req;
  *req.mutable_spec() = *spec;
  req.set_time(part->balance() == v1::BALANCE_TIME);
  auto reply = stage0->Profile(req, kControlDeadlineS);
  if (!reply.ok()) return Annotate(reply.status(), "stage 0 profiling the model");
  std::vector<double> costs;
  LinkCosts link;  // balance: time with link_gbps: what each cut sends costs its time
  if (req.time() && part->link_gbps() > 0) {
    link.bytes_per_second = part->link_gbps() * 1e9 / 8;
    link.latency_s = part->link_latency_ms() / 1000;
  }
  for (const auto& layer : reply->layers()) {
    costs.push_back(req.time() ? layer.seconds() : static_cast<double>(layer.parameters()));
    link.output_bytes.push_back(static_cast<double>(layer.output_bytes()));
  }
  if (static_cast<int>(costs.size()) < chunks) return absl::InvalidArgumentError("more chunks than layers");
  std::string cut;
  const int micro_batches = static_cast<int>(MicroBatchCount(*spec, spec->batch_size()));
  for (int b : ScheduledBoundaries(costs, spec->schedule(), part->stages(), micro_batches,
                                   std::max(1, spec->virtual_stages()), link)) {
    part->add_boundaries(b);
    cut += (cut.empty() ? "" : ", ") + std::to_string(b);
  }
  LOG_INFO("job ", job_id, ": balanced by ", req.time() ? "time" : "parameters",
           link.bytes_per_second > 0 ? " and a link of " + std::to_string(part->link_gbps()) + " Gb/s" : "",
           ", boundaries [", cut, "]");
  return absl::OkStatus();
}

// A TorchScript model's or exported program's layers and a data file's shapes, from stage 0, into
// `spec`.
Status DescribeFiles(const std::string& job_id, StageClient* stage0, v1::JobSpec* spec) {
  const bool script = ModelFromFile(spec->model());
  const bool data_files = spec->data().kind() == v1::DATA_TENSORS || spec->data().kind() == v1::DATA_TOKENS;
  if (!script && !data_files) return absl::OkStatus();
  // Stage 0 reads the archive and the data file; what it finds completes the
  // spec that every stage then gets.
  auto reply = stage0->Describe(*spec, kControlDeadlineS);
  if (!reply.ok()) return ForStage(reply.status(), 0);
  ApplyDescription(*reply, spec);
  LOG_INFO("job ", job_id, ": ", reply->num_layers(), " layers", script ? " in " + spec->model().torchscript() + spec->model().exported() : "");
  return ValidateJobSpec(*spec);  // now with the layer count: stages against layers, boundaries
}

}  // namespace

StatusOr<std::vector<v1::StageInfo>> InfoAll(const std::vector<StageClient*>& stages, double timeout_s) {
  std::vector<v1::StageInfo> infos;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    // Fails at once on a refused connection: a job does not wait for a stage
    // server that is not there (a resumed job waits in recovery instead).
    auto info = stages[s]->Ping(timeout_s);
    if (!info.ok()) return ForStage(info.status(), s);
    infos.push_back(std::move(*info));
  }
  return infos;
}

StatusOr<std::vector<v1::StageAssignment>> PlanJob(const std::string& job_id, const std::vector<StageClient*>& stages,
                                                   v1::JobSpec* spec) {
  const int p = static_cast<int>(stages.size());
  // Every stage must answer before any is configured: a dead address fails
  // the job within stage_timeout instead of hanging it.
  CONVEYOR_RETURN_IF_ERROR(InfoAll(stages, spec->stage_timeout_s()).status());
  CONVEYOR_RETURN_IF_ERROR(DescribeFiles(job_id, stages[0], spec));
  CONVEYOR_RETURN_IF_ERROR(BalancePartition(job_id, stages[0], spec));
  CONVEYOR_ASSIGN_OR_RETURN(std::vector<LayerRange> ranges, PartitionLayers(*spec));
  const int chunks = static_cast<int>(ranges.size());  // p * virtual_stages
  // What crosses into each chunk (a tuple's tensors: dtype, per-sample shape,
  // whether it takes a gradient), probed along the chain on the stage that
  // will hold it.
  std::vector<std::vector<v1::SampleSpec>> specs(1);
  specs[0].emplace_back().set_dtype(InputDType(*spec));
  for (int64_t d : InputSampleShape(*spec)) specs[0][0].add_shape(d);
  for (int c = 0; c < chunks; ++c) {
    v1::ProbeRequest probe;
    *probe.mutable_spec() = *spec;
    probe.set_layer_begin(ranges[c].begin);
    probe.set_layer_end(ranges[c].end);
    *probe.mutable_input_sample_shape() = specs.back().front().shape();
    for (const auto& in : specs.back()) *probe.add_inputs() = in;
    const int holder = StageOfChunk(spec->schedule(), c, p);
    auto reply = stages[holder]->Probe(probe, kControlDeadlineS);
    if (!reply.ok()) return ForStage(reply.status(), holder);
    if (reply->outputs().empty()) {  // a stage that knows one tensor only
      v1::SampleSpec one;
      one.set_dtype(ActivationDType(*spec));
      *one.mutable_shape() = reply->output_sample_shape();
      one.set_requires_grad(true);
      specs.push_back({one});
    } else {
      specs.emplace_back(reply->outputs().begin(), reply->outputs().end());
    }
  }
  const bool ring = LinksInARing(spec->schedule(), chunks, p);
  std::vector<v1::StageAssignment> assignments;
  for (int s = 0; s < p; ++s) {
    v1::StageAssignment a;
    a.set_job_id(job_id);
    *a.mutable_spec() = *spec;
    a.set_stage_index(s);
    a.set_num_stages(p);
    a.set_num_chunks(chunks);
    if (s > 0 || ring) a.set_upstream(stages[(s + p - 1) % p]->address());
    if (s + 1 < p || ring) a.set_downstream(stages[(s + 1) % p]->address());
    for (int local = 0; local < chunks / p; ++local) {
      const int c = ModelChunk(spec->schedule(), s, local, p);
      v1::ChunkAssignment* ca = a.add_chunks();
      ca->set_index(c);
      ca->set_layer_begin(ranges[c].begin);
      ca->set_layer_end(ranges[c].end);
      *ca->mutable_input_sample_shape() = specs[c].front().shape();
      *ca->mutable_output_sample_shape() = specs[c + 1].front().shape();
      for (const auto& in : specs[c]) *ca->add_inputs() = in;
      for (const auto& out : specs[c + 1]) *ca->add_outputs() = out;
    }
    assignments.push_back(std::move(a));
  }
  return assignments;
}

StatusOr<std::vector<v1::LinkSetup>> PlanLinks(const std::string& job_id, const v1::JobSpec& spec,
                                               const std::vector<StageClient*>& stages, bool ring) {
  const int p = static_cast<int>(stages.size());
  std::vector<v1::LinkSetup> upstream(p);
  const v1::TransportKind want = spec.transport() == v1::TRANSPORT_UNSPECIFIED ? v1::TRANSPORT_AUTO : spec.transport();
  if (p == 1 || want == v1::TRANSPORT_GRPC) return upstream;
  CONVEYOR_ASSIGN_OR_RETURN(std::vector<v1::StageInfo> infos, InfoAll(stages, spec.stage_timeout_s()));
  for (int s = 0; s < (ring ? p : p - 1); ++s) {
    const int d = (s + 1) % p;
    const std::string link = "stage " + std::to_string(s) + " -> stage " + std::to_string(d);
    infos[s].set_stage_index(s);  // what the reasons name
    infos[d].set_stage_index(d);
    const std::string why = WhyNotNccl(infos[s], stages[s]->address(), infos[d], stages[d]->address());
    if (!why.empty()) {
      if (want == v1::TRANSPORT_NCCL)
        return absl::FailedPreconditionError("transport nccl: the link " + link + " cannot use NCCL: " + why);
      LOG_INFO("job ", job_id, ": link ", link, " uses gRPC (", why, ")");
      continue;
    }
    v1::JobRef ref;
    ref.set_job_id(job_id);
    auto setup = stages[s]->PrepareLink(ref, kControlDeadlineS);
    if (!setup.ok()) return Annotate(setup.status(), "link " + link);
    upstream[d] = *setup;
  }
  return upstream;
}

StatusOr<std::vector<v1::CollectiveKind>> PlanCollectives(const v1::JobSpec& spec, std::vector<v1::StageInfo> infos,
                                                          const std::vector<std::string>& addresses, int p) {
  const v1::CollectiveKind want =
      spec.collectives() == v1::COLLECTIVES_UNSPECIFIED ? v1::COLLECTIVES_AUTO : spec.collectives();
  std::vector<v1::CollectiveKind> kinds(static_cast<std::size_t>(p), v1::COLLECTIVES_GLOO);
  if (want == v1::COLLECTIVES_GLOO) return kinds;
  const int n = static_cast<int>(std::min(infos.size(), addresses.size()));
  for (int s = 0; s < p; ++s) {
    std::string why;
    for (int a = s; a < n && why.empty(); a += p) {
      for (int b = a + p; b < n && why.empty(); b += p) {
        infos[a].set_stage_index(s);
        infos[b].set_stage_index(s);
        why = WhyNotNccl(infos[a], addresses[a], infos[b], addresses[b]);
        if (!why.empty()) why = "replicas " + std::to_string(a / p) + " and " + std::to_string(b / p) + ": " + why;
      }
    }
    if (why.empty()) {
      kinds[static_cast<std::size_t>(s)] = v1::COLLECTIVES_NCCL;
    } else if (want == v1::COLLECTIVES_NCCL) {
      return absl::FailedPreconditionError("collectives nccl: the copies of stage " + std::to_string(s) +
                                           " cannot sum their gradients with NCCL (" + why + ")");
    }
  }
  return kinds;
}

std::string WhyNotNccl(const v1::StageInfo& a, const std::string& address_a, const v1::StageInfo& b,
                       const std::string& address_b) {
  for (const v1::StageInfo* e : {&a, &b}) {
    if (!e->nccl()) {
      return "stage " + std::to_string(e->stage_index()) + " is on " + e->device() +
             (e->device().rfind("cuda", 0) == 0 ? " in a server built without NCCL" : ", not a CUDA device");
    }
  }
  if (!a.gpu_uuid().empty() && !b.gpu_uuid().empty()) {
    return a.gpu_uuid() == b.gpu_uuid() ? "both stages are on the GPU " + a.gpu_uuid() : "";
  }
  auto gpu = [](const std::string& device) { return device == "cuda" ? std::string("cuda:0") : device; };
  if (HostOf(address_a) == HostOf(address_b) && gpu(a.device()) == gpu(b.device()))
    return "both stages are on " + gpu(a.device()) + " of " + HostOf(address_a);
  return "";
}

std::string HostOf(const std::string& address) {
  std::string a = address;
  if (a.rfind("inproc://", 0) == 0) return "127.0.0.1";
  for (const char* scheme : {"dns:///", "ipv4:", "ipv6:"})
    if (a.rfind(scheme, 0) == 0) a = a.substr(std::string(scheme).size());
  if (!a.empty() && a.front() == '[') {
    const auto close = a.find(']');
    return close == std::string::npos ? a : a.substr(1, close - 1);
  }
  const auto colon = a.rfind(':');
  return colon == std::string::npos ? a : a.substr(0, colon);
}

}  // namespace conveyor
