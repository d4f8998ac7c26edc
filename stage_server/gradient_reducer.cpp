#include "stage_server/gradient_reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <utility>

namespace conveyor {

GradientReducer::GradientReducer(ReplicaGroup* group, std::vector<at::Tensor> params, int64_t bucket_bytes,
                                 bool hooks, bool slice)
    : group_(group), slice_(slice), params_(std::move(params)), slot_(params_.size()), armed_(params_.size()), ready_(params_.size()) {
  // Reverse order, one open bucket per (dtype, device); a bucket closes when
  // the next parameter would take it past bucket_bytes.
  std::map<std::pair<int, std::string>, std::size_t> open;
  std::map<std::size_t, int64_t> bytes;
  for (std::size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& p = params_[k];
    const auto key = std::make_pair(static_cast<int>(p.scalar_type()), p.device().str());
    const int64_t size = p.numel() * static_cast<int64_t>(p.element_size());
    auto it = open.find(key);
    if (it == open.end() || (bytes[it->second] > 0 && bytes[it->second] + size > bucket_bytes)) {
      buckets_.emplace_back();
      it = open.insert_or_assign(key, buckets_.size() - 1).first;
    }
    Bucket& b = buckets_[it->second];
    slot_[k] = {it->second, b.members.size()};
    b.offsets.push_back(b.members.empty() ? 0 : b.offsets.back() + params_[b.members.back()].numel());
    b.members.push_back(k);
    bytes[it->second] += size;
  }
  for (Bucket& b : buckets_) {
    const at::Tensor& last = params_[b.members.back()];
    int64_t n = b.offsets.back() + last.numel();
    if (slice_) n = (n + group_->size() - 1) / group_->size() * group_->size();  // equal slices
    b.flat = at::zeros({n}, last.options().requires_grad(false));
  }
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) view_data_.push_back(View(i).data_ptr());
  for (std::size_t i = 0; i < params_.size(); ++i) Attach(i);
  for (std::size_t i = 0; hooks && i < params_.size(); ++i) {
    // After the accumulator has added a gradient (DDP's Reducer hooks the
    // same place): the view then holds it.
    accumulators_.push_back(torch::autograd::impl::grad_accumulator(params_[i]));
    hooks_.push_back(accumulators_.back()->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          OnAccumulated(i);
          return outputs;
        })));
  }
}

GradientReducer::~GradientReducer() {
  for (std::size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hooks_[i]);
}

at::Tensor GradientReducer::ViewIn(const at::Tensor& flat, std::size_t i) const {
  const at::Tensor& p = params_[i];
  const auto [b, m] = slot_[i];
  at::Tensor part = flat.narrow(0, buckets_[b].offsets[m], p.numel());
  // The parameter's own layout where it is dense (channels-last weights
  // too), so that autograd's gradients add without a strided copy.
  if (p.is_non_overlapping_and_dense()) return part.as_strided(p.sizes(), p.strides());
  return part.view(p.sizes());
}

void GradientReducer::Attach(std::size_t i) {
  at::Tensor& p = params_[i];
  const at::Tensor& held = p.grad();
  // The hooks' path on every gradient: a pointer compared, no tensor made.
  if (held.defined() && held.data_ptr() == view_data_[i]) return;
  at::Tensor view = View(i);
  if (held.defined()) {
    view.copy_(held);
  } else {
    view.zero_();
  }
  p.mutable_grad() = view;
}

void GradientReducer::ZeroGrads() {
  std::lock_guard<std::mutex> lock(mu_);
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params_.size(); ++i) Attach(i);
  for (Bucket& b : buckets_) b.flat.zero_();
}

void GradientReducer::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(armed_.begin(), armed_.end(), false);
  std::fill(ready_.begin(), ready_.end(), false);
  for (Bucket& b : buckets_) {
    b.ready = 0;
    b.work.reset();
  }
  next_ = 0;
  error_ = absl::OkStatus();
}

Status GradientReducer::Arm(std::size_t first, std::size_t last) {
  CONVEYOR_RETURN_IF_ERROR(group_->Join());
  std::lock_guard<std::mutex> lock(mu_);
  at::NoGradGuard no_grad;
  for (std::size_t i = first; i < last && i < params_.size(); ++i) {
    Attach(i);
    armed_[i] = true;
  }
  return absl::OkStatus();
}

void GradientReducer::OnAccumulated(std::size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!armed_[i]) return;
  if (ready_[i]) {  // a second gradient in the armed pass
    if (slot_[i].first < next_ && error_.ok())
      error_ = absl::InternalError("a gradient of parameter " + std::to_string(i) + " came after its bucket's all-reduce");
    return;
  }
  // The accumulator replaced the gradient (it was not the view): back into
  // the bucket.
  at::NoGradGuard no_grad;
  Attach(i);
  MarkReady(i);
  StartReady();
}

void GradientReducer::MarkReady(std::size_t i) {
  ready_[i] = true;
  ++buckets_[slot_[i].first].ready;
}

void GradientReducer::StartReady() {
  while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].members.size()) {
    Bucket& b = buckets_[next_++];
    if (!error_.ok()) continue;
    auto work = slice_ ? group_->StartReduceScatter(b.flat) : group_->StartAllReduce(b.flat);
    if (work.ok()) {
      b.work = std::move(*work);
    } else {
      error_ = work.status();
    }
  }
}

std::vector<GradientReducer::Part> GradientReducer::SliceParameters() {
  std::vector<Part> parts;
  if (!slice_) return parts;
  param_flats_.clear();
  places_.clear();
  for (const Bucket& b : buckets_) param_flats_.push_back(at::zeros_like(b.flat));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];  // shares the module's TensorImpl: the module sees the move
    const auto [k, m] = slot_[i];
    const at::Tensor& flat = param_flats_[k];
    at::Tensor place = ViewIn(flat, i);
    place.copy_(p);
    p.set_(flat.storage(), place.storage_offset(), place.sizes(), place.strides());
    // The parameter's elements in this member's slice [lo, hi) of the bucket.
    const int64_t size = flat.numel() / group_->size();
    const int64_t first = buckets_[k].offsets[m];
    const int64_t lo = std::max(first, size * group_->rank());
    const int64_t hi = std::min(first + p.numel(), size * (group_->rank() + 1));
    if (lo >= hi) continue;
    at::Tensor part = at::empty({0}, flat.options());
    part.set_(flat.storage(), flat.storage_offset() + lo, {hi - lo}, {1});
    part.set_requires_grad(true);
    part.mutable_grad() = buckets_[k].flat.narrow(0, lo, hi - lo);
    parts.push_back({i, part});
    places_.push_back({k, lo, hi});
  }
  return parts;
}

Status GradientReducer::GatherParameters() { return group_->AllGather(param_flats_); }

StatusOr<std::vector<at::Tensor>> GradientReducer::GatherWhole(const std::vector<at::Tensor>& parts) {
  if (parts.size() != places_.size())
    return absl::InternalError("GatherWhole: " + std::to_string(parts.size()) + " parts given for " +
                               std::to_string(places_.size()));
  std::vector<at::Tensor> flats;
  for (const at::Tensor& f : param_flats_) flats.push_back(at::zeros_like(f));
  for (std::size_t j = 0; j < parts.size(); ++j) {
    if (!parts[j].defined()) continue;
    const Place& place = places_[j];
    flats[place.bucket].narrow(0, place.lo, place.hi - place.lo).copy_(parts[j].reshape({-1}));
  }
  CONVEYOR_RETURN_IF_ERROR(group_->AllGather(flats));
  std::vector<at::Tensor> whole;
  for (std::size_t i = 0; i < params_.size(); ++i) whole.push_back(ViewIn(flats[slot_[i].first], i));
  return whole;
}

StatusOr<std::vector<at::Tensor>> GradientReducer::PartsOf(const std::vector<at::Tensor>& whole) const {
  std::vector<at::Tensor> flats;
  for (const at::Tensor& f : param_flats_) flats.push_back(at::zeros_like(f));
  for (std::size_t i = 0; i < params_.size() && i < whole.size(); ++i) {
    if (!whole[i].defined()) continue;
    if (whole[i].sizes() != params_[i].sizes())
      return absl::FailedPreconditionError("parameter " + std::to_string(i) + "'s state has another shape than it");
    ViewIn(flats[slot_[i].first], i).copy_(whole[i]);
  }
  std::vector<at::Tensor> parts;
  for (const Place& place : places_) parts.push_back(flats[place.bucket].narrow(0, place.lo, place.hi - place.lo).clone());
  return parts;
}

Status GradientReducer::Finish() {
  std::unique_lock<std::mutex> lock(mu_);
  {
    at::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (ready_[i]) continue;
      Attach(i);
      MarkReady(i);
    }
  }
  StartReady();
  Status st = error_;
  lock.unlock();
  for (Bucket& b : buckets_) {
    if (!b.work) continue;
    Status waited = b.work->Wait();
    if (st.ok()) st = waited;
  }
  // Sums on the device: the host waits for them here, unless the step's end
  // does (ReplicaGroup::DeferConfirm; their spans' ends are then 0).
  if (st.ok()) st = group_->Confirm();
  spans_.clear();
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    if (buckets_[k].work) spans_.push_back({static_cast<int>(k), buckets_[k].work->start_us(), buckets_[k].work->end_us()});
  }
  Reset();
  return st;
}

}  // namespace conveyor
