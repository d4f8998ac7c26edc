#include "stage_server/stage.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>

#include <atomic>
#include <optional>
#include <map>
#include <mutex>

#include "common/dataset.h"
#include "common/digest.h"
#include "common/executor.h"
#include "common/job_spec.h"
#include "common/logging.h"
#include "common/models.h"
#include "common/tensor_codec.h"
#include "common/device.h"
#include "common/training.h"
#include "common/wire.h"
#include "stage_server/inbox.h"
#include "stage_server/schedule.h"

namespace conveyor {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int64_t> ToVector(at::IntArrayRef a) { return std::vector<int64_t>(a.begin(), a.end()); }

// One micro-batch's tensors kept between its forward and its backward.
struct Held {
  at::Tensor input;   // requires grad at stages > 0
  at::Tensor output;  // the activation sent on, or the loss at the last stage
  int64_t bytes = 0;
};

}  // namespace

class Stage::Impl {
 public:
  Impl(const StageOptions& options, at::Device device) : options_(options), device_(device) {}

  StatusOr<v1::ConfigureReply> Configure(const v1::StageAssignment& a);
  StatusOr<v1::ConnectReply> Connect(const v1::JobRef& ref);
  StatusOr<v1::RunStepReply> RunStep(const v1::RunStepRequest& req);
  StatusOr<v1::DigestReply> GetDigest(const v1::JobRef& ref);
  StatusOr<v1::ParametersReply> GetParameters(const v1::JobRef& ref);
  Status Release(const v1::JobRef& ref);
  Status Abort(const v1::AbortRequest& req);
  v1::StageInfo Info() const;

  SerialExecutor& executor() { return executor_; }
  Inbox& inbox() { return inbox_; }

 private:
  // Everything of the configured job; touched on the executor thread only.
  struct Job {
    v1::StageAssignment assignment;
    torch::nn::Sequential layers{nullptr};
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::unique_ptr<Dataset> data;
    std::unique_ptr<Transport> transport;
    std::vector<int64_t> input_shape, output_shape;
    bool first = false, last = false;
    const v1::JobSpec& spec() const { return assignment.spec(); }
  };

  Status CheckJob(const std::string& job_id) const;
  void DropJob();
  std::string Who() const { return "stage " + std::to_string(job_ ? job_->assignment.stage_index() : -1); }
  StatusOr<at::Tensor> Receive(v1::FrameKind kind, int mb, int64_t rows, Clock::time_point deadline);
  Status Send(Peer peer, v1::FrameKind kind, const v1::RunStepRequest& req, int mb, const at::Tensor& t);
  Status RunActions(const v1::RunStepRequest& req, v1::RunStepReply* reply);

  const StageOptions options_;
  const at::Device device_;
  SerialExecutor executor_;
  Inbox inbox_;
  std::unique_ptr<Job> job_;

  mutable std::mutex info_mu_;  // guards the two fields below, read by Info() and Abort()
  std::string job_id_;
  int stage_index_ = -1;
};

Status Stage::Impl::CheckJob(const std::string& job_id) const {
  if (!job_) return absl::FailedPreconditionError("this stage has no job configured (asked for '" + job_id + "')");
  if (job_->assignment.job_id() != job_id) {
    return absl::FailedPreconditionError("this stage runs job '" + job_->assignment.job_id() + "', not '" +
                                         job_id + "'");
  }
  return absl::OkStatus();
}

void Stage::Impl::DropJob() {
  inbox_.Close();
  if (job_ && job_->transport) job_->transport->Shutdown();
  job_.reset();
  std::lock_guard<std::mutex> lock(info_mu_);
  job_id_.clear();
  stage_index_ = -1;
}

StatusOr<v1::ConfigureReply> Stage::Impl::Configure(const v1::StageAssignment& a) {
  const std::string who = "stage " + std::to_string(a.stage_index());
  if (a.job_id().empty()) return absl::InvalidArgumentError(who + ": job_id is empty");
  CONVEYOR_RETURN_IF_ERROR(Annotate(ValidateJobSpec(a.spec()), who));
  if (a.num_stages() < 1 || a.stage_index() < 0 || a.stage_index() >= a.num_stages()) {
    return absl::InvalidArgumentError(who + ": stage index out of range for " + std::to_string(a.num_stages()) +
                                      " stages");
  }
  if (a.input_sample_shape_size() == 0 || a.input_sample_shape_size() > 8)
    return absl::InvalidArgumentError(who + ": input_sample_shape must have 1 to 8 dimensions");
  for (int64_t d : a.input_sample_shape())
    if (d <= 0 || d > (int64_t{1} << 31)) return absl::InvalidArgumentError(who + ": bad input_sample_shape");
  DropJob();

  auto job = std::make_unique<Job>();
  job->assignment = a;
  job->first = a.stage_index() == 0;
  job->last = a.stage_index() == a.num_stages() - 1;
  job->input_shape.assign(a.input_sample_shape().begin(), a.input_sample_shape().end());
  CONVEYOR_ASSIGN_OR_RETURN(job->layers, BuildLayers(a.spec(), a.layer_begin(), a.layer_end()));
  if (job->first || job->last) {
    auto data = Dataset::Open(a.spec(), job->first, job->last);
    if (!data.ok()) return Annotate(data.status(), who);
    job->data = std::move(*data);
  }
  try {
    job->layers->to(device_);
    at::NoGradGuard no_grad;
    std::vector<int64_t> probe{1};
    probe.insert(probe.end(), job->input_shape.begin(), job->input_shape.end());
    at::Tensor out = job->layers->forward(at::zeros(probe, at::TensorOptions().device(device_)));
    job->output_shape = ToVector(out.sizes().slice(1));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(who + ": layers [" + std::to_string(a.layer_begin()) + ", " +
                                      std::to_string(a.layer_end()) + ") cannot take samples of shape " +
                                      ShapeString(job->input_shape) + ": " + e.what_without_backtrace());
  }
  std::vector<at::Tensor> params = job->layers->parameters();
  int64_t num_params = 0;
  for (const auto& p : params) num_params += p.numel();
  if (!params.empty()) job->optimizer = MakeOptimizer(a.spec().optimizer(), params);

  const v1::JobSpec& spec = a.spec();
  std::vector<int64_t> train_mbs = MicroBatchSizes(spec, spec.batch_size());
  std::vector<int64_t> eval_mbs = MicroBatchSizes(spec, spec.eval_batch_size());
  InboxExpectations expect;
  expect.job_id = a.job_id();
  expect.stage_index = a.stage_index();
  expect.dtype = v1::DTYPE_FLOAT32;
  if (!job->first) expect.activation_sample_shape = job->input_shape;
  if (!job->last) expect.gradient_sample_shape = job->output_shape;
  expect.max_micro_batches = static_cast<int>(std::max(train_mbs.size(), eval_mbs.size()));
  expect.max_micro_batch_size = std::max(train_mbs.front(), eval_mbs.front());
  inbox_.Open(std::move(expect));

  v1::ConfigureReply reply;
  for (int64_t d : job->output_shape) reply.add_output_sample_shape(d);
  reply.set_num_parameters(num_params);
  reply.set_device(device_.str());
  if (job->data) {
    reply.set_train_samples(job->data->train_size());
    reply.set_test_samples(job->data->test_size());
  }
  LOG_INFO("job ", a.job_id(), " ", who, ": layers [", a.layer_begin(), ", ", a.layer_end(), "), ", num_params,
           " parameters, input ", ShapeString(job->input_shape), " -> output ", ShapeString(job->output_shape),
           " on ", device_.str());
  job_ = std::move(job);
  std::lock_guard<std::mutex> lock(info_mu_);
  job_id_ = a.job_id();
  stage_index_ = a.stage_index();
  return reply;
}

StatusOr<v1::ConnectReply> Stage::Impl::Connect(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  if (job_->transport) job_->transport->Shutdown();
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(job_->spec().stage_timeout_s()));
  auto transport = options_.transports->Connect(job_->assignment, deadline);
  if (!transport.ok()) return Annotate(transport.status(), Who());
  job_->transport = std::move(*transport);
  v1::ConnectReply reply;
  reply.set_transport(job_->transport->Name());
  return reply;
}

StatusOr<at::Tensor> Stage::Impl::Receive(v1::FrameKind kind, int mb, int64_t rows, Clock::time_point deadline) {
  CONVEYOR_ASSIGN_OR_RETURN(v1::TensorFrame frame, inbox_.Take(kind, mb, deadline));
  if (frame.tensor().shape(0) != rows) {
    return absl::InvalidArgumentError(Who() + " micro-batch " + std::to_string(mb) + ": " +
                                      (kind == v1::FRAME_ACTIVATION ? "activation" : "gradient") + " has " +
                                      std::to_string(frame.tensor().shape(0)) + " samples, expected " +
                                      std::to_string(rows));
  }
  return DecodeTensor(frame.mutable_tensor()).to(device_);
}

Status Stage::Impl::Send(Peer peer, v1::FrameKind kind, const v1::RunStepRequest& req, int mb,
                         const at::Tensor& t) {
  v1::TensorFrame frame;
  frame.set_job_id(req.job_id());
  frame.set_phase(req.phase());
  frame.set_step(req.step());
  frame.set_micro_batch(mb);
  frame.set_kind(kind);
  frame.set_from_stage(job_->assignment.stage_index());
  CONVEYOR_RETURN_IF_ERROR(EncodeTensor(t, frame.mutable_tensor()));
  return Annotate(job_->transport->Send(peer, std::move(frame)), Who());
}

Status Stage::Impl::RunActions(const v1::RunStepRequest& req, v1::RunStepReply* reply) {
  const v1::JobSpec& spec = job_->spec();
  const bool train = req.phase() == v1::PHASE_TRAIN;
  const int64_t batch = req.batch_size();
  const std::vector<int64_t> sizes = MicroBatchSizes(spec, batch);
  std::vector<int64_t> offsets{0};
  for (int64_t n : sizes) offsets.push_back(offsets.back() + n);
  const int m = static_cast<int>(sizes.size());
  const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(spec.stage_timeout_s()));

  at::Tensor inputs, labels;
  if (job_->first) inputs = job_->data->Inputs(req.phase(), req.step()).to(device_);
  if (job_->last) labels = job_->data->Labels(req.phase(), req.step()).to(device_);
  if ((inputs.defined() && inputs.size(0) != batch) || (labels.defined() && labels.size(0) != batch)) {
    return absl::FailedPreconditionError(Who() + ": the data gives a different batch size than " +
                                         std::to_string(batch) + " for step " + std::to_string(req.step()));
  }
  std::unique_ptr<at::NoGradGuard> no_grad;
  if (train) {
    job_->layers->train();
    if (job_->optimizer) job_->optimizer->zero_grad();
  } else {
    job_->layers->eval();
    no_grad = std::make_unique<at::NoGradGuard>();
  }
  const std::vector<Action> actions =
      train ? BuildSchedule(spec.schedule(), job_->assignment.stage_index(), job_->assignment.num_stages(), m)
            : ForwardOnly(m);

  std::map<int, Held> held;
  int64_t held_bytes = 0, peak_count = 0, peak_bytes = 0;
  double busy = 0, loss_sum = 0;
  int64_t correct = 0;
  std::string doing;
  try {
    for (const Action& act : actions) {
      const int mb = act.micro_batch;
      const int64_t rows = sizes[mb];
      doing = std::string(act.type == ActionType::kForward ? "forward" : "backward") + " of micro-batch " +
              std::to_string(mb);
      if (act.type == ActionType::kForward) {
        at::Tensor x;
        if (job_->first) {
          x = inputs.narrow(0, offsets[mb], rows);
        } else {
          CONVEYOR_ASSIGN_OR_RETURN(x, Receive(v1::FRAME_ACTIVATION, mb, rows, Clock::now() + timeout));
          if (train) x.requires_grad_(true);
        }
        auto t0 = Clock::now();
        at::Tensor out = job_->layers->forward(x);
        Held h{x, out, 0};
        if (job_->last) {
          at::Tensor y = labels.narrow(0, offsets[mb], rows);
          h.output = ComputeLoss(spec, out, y, static_cast<double>(rows) / static_cast<double>(batch));
          loss_sum += h.output.item<double>();
          if (!train) correct += CountCorrect(out, y);
        }
        busy += std::chrono::duration<double>(Clock::now() - t0).count();
        if (!job_->last) CONVEYOR_RETURN_IF_ERROR(Send(Peer::kDownstream, v1::FRAME_ACTIVATION, req, mb, out));
        if (train) {
          h.bytes = x.numel() * x.element_size() + out.numel() * out.element_size();
          held_bytes += h.bytes;
          held.emplace(mb, std::move(h));
          peak_count = std::max<int64_t>(peak_count, static_cast<int64_t>(held.size()));
          peak_bytes = std::max(peak_bytes, held_bytes);
        }
      } else {
        auto it = held.find(mb);
        if (it == held.end()) return absl::InternalError(Who() + ": backward before forward of micro-batch " + std::to_string(mb));
        Held& h = it->second;
        at::Tensor grad;
        if (!job_->last) {
          CONVEYOR_ASSIGN_OR_RETURN(grad, Receive(v1::FRAME_GRADIENT, mb, rows, Clock::now() + timeout));
        }
        auto t0 = Clock::now();
        if (h.output.requires_grad()) {
          if (grad.defined()) {
            h.output.backward(grad);
          } else {
            h.output.backward();
          }
        }
        busy += std::chrono::duration<double>(Clock::now() - t0).count();
        if (!job_->first) {
          at::Tensor gx = h.input.grad();
          if (!gx.defined()) gx = at::zeros_like(h.input);
          CONVEYOR_RETURN_IF_ERROR(Send(Peer::kUpstream, v1::FRAME_GRADIENT, req, mb, gx));
        }
        held_bytes -= h.bytes;
        held.erase(it);
      }
    }
    if (train && job_->optimizer) {
      doing = "optimizer step";
      auto t0 = Clock::now();
      job_->optimizer->step();
      busy += std::chrono::duration<double>(Clock::now() - t0).count();
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(Who() + " step " + std::to_string(req.step()) + ", " + doing + ": " +
                               e.what_without_backtrace());
  }
  reply->set_loss_sum(loss_sum);
  reply->set_correct(correct);
  reply->set_samples(batch);
  reply->set_peak_activations(peak_count);
  reply->set_peak_activation_bytes(peak_bytes);
  reply->set_busy_seconds(busy);
  return absl::OkStatus();
}

StatusOr<v1::RunStepReply> Stage::Impl::RunStep(const v1::RunStepRequest& req) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(req.job_id()));
  if (req.phase() != v1::PHASE_TRAIN && req.phase() != v1::PHASE_EVAL)
    return absl::InvalidArgumentError(Who() + ": step without a phase");
  if (req.phase() == v1::PHASE_EVAL && !job_->spec().eval())
    return absl::InvalidArgumentError(Who() + ": this job does not evaluate");
  const int64_t max_batch = req.phase() == v1::PHASE_TRAIN ? job_->spec().batch_size() : job_->spec().eval_batch_size();
  if (req.batch_size() < 1 || req.batch_size() > max_batch)
    return absl::InvalidArgumentError(Who() + ": batch_size " + std::to_string(req.batch_size()) +
                                      " is out of range [1, " + std::to_string(max_batch) + "]");
  if (req.step() < 0) return absl::InvalidArgumentError(Who() + ": negative step");
  if (job_->data && req.phase() == v1::PHASE_EVAL && req.step() >= job_->data->EvalBatches())
    return absl::InvalidArgumentError(Who() + ": eval batch " + std::to_string(req.step()) + " is past the test split");
  if (!job_->transport && job_->assignment.num_stages() > 1)
    return absl::FailedPreconditionError(Who() + ": not connected to its neighbours (call Connect first)");
  inbox_.BeginStep(req.phase(), req.step());
  auto start = Clock::now();
  v1::RunStepReply reply;
  Status st = RunActions(req, &reply);
  if (!st.ok()) {
    LOG_WARN("job ", req.job_id(), " ", Who(), " step ", req.step(), " failed: ", st.message());
    return st;
  }
  reply.set_step_seconds(std::chrono::duration<double>(Clock::now() - start).count());
  return reply;
}

StatusOr<v1::DigestReply> Stage::Impl::GetDigest(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  v1::DigestReply reply;
  for (const auto& child : job_->layers->children()) reply.add_layer_digests(LayerDigest(*child));
  return reply;
}

StatusOr<v1::ParametersReply> Stage::Impl::GetParameters(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  v1::ParametersReply reply;
  for (const auto& [name, t] : NamedParameters(job_->layers)) {
    v1::NamedTensor* nt = reply.add_parameters();
    nt->set_name(name);
    CONVEYOR_RETURN_IF_ERROR(EncodeTensor(t, nt->mutable_tensor()));
  }
  return reply;
}

Status Stage::Impl::Release(const v1::JobRef& ref) {
  CONVEYOR_RETURN_IF_ERROR(CheckJob(ref.job_id()));
  DropJob();
  return absl::OkStatus();
}

Status Stage::Impl::Abort(const v1::AbortRequest& req) {
  std::lock_guard<std::mutex> lock(info_mu_);
  if (job_id_ != req.job_id()) return absl::OkStatus();  // nothing of that job runs here
  inbox_.Fail(absl::AbortedError("stage " + std::to_string(stage_index_) + ": step aborted: " + req.reason()));
  return absl::OkStatus();
}

v1::StageInfo Stage::Impl::Info() const {
  v1::StageInfo info;
  info.set_version(CONVEYOR_VERSION);
  info.set_device(device_.str());
  info.set_threads(ComputeThreads());
  std::lock_guard<std::mutex> lock(info_mu_);
  info.set_job_id(job_id_);
  info.set_stage_index(stage_index_);
  return info;
}

// ----------------------------------------------------------------- Stage --

StatusOr<std::unique_ptr<Stage>> Stage::Create(const StageOptions& options) {
  if (!options.transports) return absl::InvalidArgumentError("a stage needs a transport factory");
  std::optional<at::Device> device;
  try {
    device.emplace(options.device);
  } catch (const c10::Error&) {
    return absl::InvalidArgumentError("unknown device '" + options.device + "' (cpu, cuda or cuda:N)");
  }
  if (device->is_cuda()) {
    if (!at::hasCUDA()) {
      return absl::FailedPreconditionError("device " + options.device +
                                           ": this build or machine has no CUDA");
    }
  } else if (!device->is_cpu()) {
    return absl::InvalidArgumentError("device " + options.device + " is not supported (cpu, cuda or cuda:N)");
  }
  SetComputeThreads(options.threads);
  return std::unique_ptr<Stage>(new Stage(std::make_unique<Impl>(options, *device)));
}

Stage::Stage(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Stage::~Stage() { Shutdown(); }

namespace {
Status Stopped() { return absl::UnavailableError("the stage is shutting down"); }
}  // namespace

StatusOr<v1::ConfigureReply> Stage::Configure(const v1::StageAssignment& a) {
  return impl_->executor().Run([&] { return impl_->Configure(a); }, StatusOr<v1::ConfigureReply>(Stopped()));
}
StatusOr<v1::ConnectReply> Stage::Connect(const v1::JobRef& ref) {
  return impl_->executor().Run([&] { return impl_->Connect(ref); }, StatusOr<v1::ConnectReply>(Stopped()));
}
StatusOr<v1::RunStepReply> Stage::RunStep(const v1::RunStepRequest& req) {
  return impl_->executor().Run([&] { return impl_->RunStep(req); }, StatusOr<v1::RunStepReply>(Stopped()));
}
StatusOr<v1::DigestReply> Stage::GetDigest(const v1::JobRef& ref) {
  return impl_->executor().Run([&] { return impl_->GetDigest(ref); }, StatusOr<v1::DigestReply>(Stopped()));
}
StatusOr<v1::ParametersReply> Stage::GetParameters(const v1::JobRef& ref) {
  return impl_->executor().Run([&] { return impl_->GetParameters(ref); },
                               StatusOr<v1::ParametersReply>(Stopped()));
}
Status Stage::Release(const v1::JobRef& ref) {
  return impl_->executor().Run([&] { return impl_->Release(ref); }, Stopped());
}
Status Stage::Abort(const v1::AbortRequest& req) { return impl_->Abort(req); }
v1::StageInfo Stage::Info() const { return impl_->Info(); }
Inbox& Stage::inbox() { return impl_->inbox(); }

void Stage::Shutdown() {
  impl_->inbox().Fail(Stopped());
  impl_->executor().Shutdown();
}

}  // namespace conveyor
