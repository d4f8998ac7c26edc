#include "common/steady_rate.h"

namespace conveyor {

void SteadyRate::Mark(int64_t done, TimePoint now) {
  if (!started_) {
    if (done < warmup_) return;
    started_ = true;
    start_done_ = end_done_ = done;
    start_ = end_ = now;
    return;
  }
  if (done <= end_done_) return;  // no step finished since: the window's end stays where it was
  end_done_ = done;
  end_ = now;
}

double SteadyRate::seconds() const { return steps() > 0 ? std::chrono::duration<double>(end_ - start_).count() : 0.0; }

double SteadyRate::samples_per_second() const {
  const double s = seconds();
  return s > 0 ? static_cast<double>(steps() * samples_per_step_) / s : 0.0;
}

}  // namespace conveyor
