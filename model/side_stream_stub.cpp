// RunOnSideStream where this build has no CUDA (see side_stream.h).
#include "model/side_stream.h"

namespace conveyor {

std::unique_ptr<SideStreamWork> RunOnSideStream(const at::Device&, const std::function<void()>& fn) {
  fn();
  return nullptr;
}

}  // namespace conveyor
