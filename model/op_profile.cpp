#include "model/op_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "model/compat.h"
#include "common/files.h"

namespace conveyor {

namespace {
namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::atomic<bool> g_running{false};

// Chrome's trace format, with Kineto's own categories ("cpu_op", "kernel",
// "gpu_memcpy"), so that one summary reads this and PyTorch's exports alike:
// host operators on pid 0 by thread, device work on pid 1 + device index.
nlohmann::json TraceOf(const kineto::ProfilerResult& result) {
  nlohmann::json events = nlohmann::json::array();
  double origin = -1;
  for (const kineto::KinetoEvent& e : result.events()) {
    const double start = EventSpanUs(e).first;
    if (origin < 0 || start < origin) origin = start;
  }
  for (const kineto::KinetoEvent& e : result.events()) {
    const auto [start, duration] = EventSpanUs(e);
    const bool device = e.deviceType() != c10::DeviceType::CPU;
    const std::string name = e.name();
    std::string cat = "cpu_op";
    if (device) cat = name.rfind("Memcpy", 0) == 0 ? "gpu_memcpy" : name.rfind("Memset", 0) == 0 ? "gpu_memset" : "kernel";
    events.push_back({{"name", name},
                      {"cat", cat},
                      {"ph", "X"},
                      {"ts", start - origin},
                      {"dur", duration},
                      {"pid", device ? 1 + static_cast<int>(e.deviceIndex()) : 0},
                      {"tid", device ? static_cast<uint64_t>(e.deviceResourceId()) : e.startThreadId()}});
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

}  // namespace

StatusOr<std::unique_ptr<OpProfile>> OpProfile::Start(bool cuda) {
  bool expected = false;
  if (!g_running.compare_exchange_strong(expected, true))
    return absl::FailedPreconditionError("a profile is already running in this process");
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  ProfilerConfig config(ProfilerState::KINETO);
  try {
    kineto::prepareProfiler(config, activities);
    kineto::enableProfiler(config, activities);
  } catch (const c10::Error& e) {
    g_running = false;
    return absl::FailedPreconditionError(std::string("cannot start the profiler: ") + e.what_without_backtrace());
  }
  std::unique_ptr<OpProfile> p(new OpProfile());
  p->running_ = true;
  return p;
}

OpProfile::~OpProfile() {
  if (!running_) return;
  try {
    kineto::disableProfiler();
  } catch (const c10::Error&) {
  }
  g_running = false;
}

Status OpProfile::Finish(const std::string& path) {
  if (!running_) return absl::FailedPreconditionError("the profile was already finished");
  running_ = false;
  std::unique_ptr<kineto::ProfilerResult> result;
  try {
    result = kineto::disableProfiler();
  } catch (const c10::Error& e) {
    g_running = false;
    return absl::InternalError(std::string("stopping the profiler: ") + e.what_without_backtrace());
  }
  g_running = false;
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) CONVEYOR_RETURN_IF_ERROR(MakeDirs(path.substr(0, slash)));
  std::ofstream out(path, std::ios::trunc);
  out << TraceOf(*result).dump();
  out.close();
  if (!out) return absl::InternalError("cannot write the profile " + path);
  return absl::OkStatus();
}

std::string ProfilePath(const std::string& dir, const std::string& job, int64_t step, const std::string& who) {
  return dir + "/" + job + "-step" + std::to_string(step) + "-" + who + ".json";
}

}  // namespace conveyor
