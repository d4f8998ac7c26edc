#include "stage_server/flat_views.h"

namespace conveyor {

std::map<std::pair<int, std::string>, std::vector<std::size_t>> ByDtypeAndDevice(const std::vector<at::Tensor>& tensors) {
  std::map<std::pair<int, std::string>, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    groups[{static_cast<int>(tensors[i].scalar_type()), tensors[i].device().str()}].push_back(i);
  return groups;
}

FlatViews FlatViews::Make(const std::vector<at::Tensor>& tensors) {
  FlatViews made;
  made.data_.assign(tensors.size(), nullptr);
  for (const auto& [key, members] : ByDtypeAndDevice(tensors)) {
    int64_t total = 0;
    for (std::size_t i : members) total += tensors[i].numel();
    at::Tensor flat = at::empty({total}, tensors[members.front()].options());
    int64_t offset = 0;
    for (std::size_t i : members) {
      at::Tensor t = tensors[i];  // shares the module's TensorImpl
      const int64_t n = t.numel();
      std::vector<int64_t> strides(t.strides().begin(), t.strides().end());
      if (!t.is_non_overlapping_and_dense()) {  // contiguous strides
        for (int64_t d = t.dim() - 1; d >= 0; --d)
          strides[d] = d == t.dim() - 1 ? 1 : strides[d + 1] * std::max<int64_t>(1, t.size(d + 1));
      }
      at::Tensor view = flat.narrow(0, offset, n).as_strided(t.sizes(), strides);
      view.copy_(t);
      t.set_(flat.storage(), flat.storage_offset() + offset, t.sizes(), strides);
      made.data_[i] = t.data_ptr();
      offset += n;
    }
    made.flats_.push_back(flat);
  }
  return made;
}

bool FlatViews::Holds(const std::vector<at::Tensor>& tensors) const {
  if (tensors.size() != data_.size()) return false;
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].data_ptr() != data_[i]) return false;
  return true;
}

}  // namespace conveyor
