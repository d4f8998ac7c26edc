#include "stage_server/gradient_reducer.h"

#include <ATen/ATen.h>

#include <map>
#include <utility>

namespace conveyor {

GradientReducer::GradientReducer(ReplicaGroup* group, std::vector<at::Tensor> params, int64_t bucket_bytes)
    : group_(group), params_(std::move(params)), slot_(params_.size()), armed_(params_.size()), filled_(params_.size()) {
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
    b.flat = at::zeros({b.offsets.back() + last.numel()}, last.options().requires_grad(false));
  }
  for (std::size_t i = 0; i < params_.size(); ++i)
    hooks_.push_back(params_[i].register_hook([this, i](const at::Tensor& grad) { OnGradient(i, grad); }));
}

GradientReducer::~GradientReducer() {
  for (std::size_t i = 0; i < params_.size(); ++i) params_[i].remove_hook(hooks_[i]);
}

void GradientReducer::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(armed_.begin(), armed_.end(), false);
  std::fill(filled_.begin(), filled_.end(), false);
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
  for (std::size_t i = first; i < last && i < params_.size(); ++i) armed_[i] = true;
  return absl::OkStatus();
}

void GradientReducer::OnGradient(std::size_t i, const at::Tensor& grad) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!armed_[i]) return;
  if (filled_[i]) {  // a second gradient in the armed pass: added, if its bucket has not started
    const auto [b, m] = slot_[i];
    if (b < next_) {
      if (error_.ok())
        error_ = absl::InternalError("a gradient of parameter " + std::to_string(i) + " came after its bucket's all-reduce");
      return;
    }
    buckets_[b].flat.narrow(0, buckets_[b].offsets[m], params_[i].numel()).add_(grad.reshape({-1}));
    return;
  }
  const at::Tensor& held = params_[i].grad();
  Fill(i, held.defined() ? held + grad : grad);
  StartReady();
}

void GradientReducer::Fill(std::size_t i, const at::Tensor& final_grad) {
  const auto [b, m] = slot_[i];
  Bucket& bucket = buckets_[b];
  at::Tensor slice = bucket.flat.narrow(0, bucket.offsets[m], params_[i].numel());
  if (final_grad.defined()) {
    slice.copy_(final_grad.reshape({-1}));
  } else {
    slice.zero_();
  }
  filled_[i] = true;
  ++bucket.ready;
}

void GradientReducer::StartReady() {
  while (next_ < buckets_.size() && buckets_[next_].ready == buckets_[next_].members.size()) {
    Bucket& b = buckets_[next_++];
    if (!error_.ok()) continue;
    auto work = group_->StartAllReduce(b.flat);
    if (work.ok()) {
      b.work = std::move(*work);
    } else {
      error_ = work.status();
    }
  }
}

Status GradientReducer::Finish() {
  std::unique_lock<std::mutex> lock(mu_);
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!filled_[i]) Fill(i, params_[i].grad());
  StartReady();
  Status st = error_;
  lock.unlock();
  for (Bucket& b : buckets_) {
    if (!b.work) continue;
    Status waited = b.work->Wait();
    if (st.ok()) st = waited;
  }
  if (st.ok()) {
    for (const Bucket& b : buckets_) {
      for (std::size_t m = 0; m < b.members.size(); ++m) {
        at::Tensor& p = params_[b.members[m]];
        at::Tensor sum = b.flat.narrow(0, b.offsets[m], p.numel()).view_as(p);
        if (p.grad().defined()) {
          p.mutable_grad().copy_(sum);
        } else {
          p.mutable_grad() = sum.clone();
        }
      }
    }
  }
  // Sums on the device: the copies above wait for them there, the host here.
  if (st.ok()) st = group_->Confirm();
  spans_.clear();
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    if (buckets_[k].work) spans_.push_back({static_cast<int>(k), buckets_[k].work->start_us(), buckets_[k].work->end_us()});
  }
  Reset();
  return st;
}

}  // namespace conveyor
