#include "cli/trace.h"

#include "cli/output.h"
#include "cli/plot.h"
#include "plan/job_spec.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>

namespace conveyor::cli {
namespace {

const char* KindName(v1::TraceEvent::Kind kind) {
  switch (kind) {
    case v1::TraceEvent::FORWARD: return "forward";
    case v1::TraceEvent::BACKWARD: return "backward";
    case v1::TraceEvent::WEIGHT: return "weight";
    case v1::TraceEvent::SEND: return "send";
    case v1::TraceEvent::RECEIVE: return "receive";
    case v1::TraceEvent::OPTIMIZER: return "optimizer";
    case v1::TraceEvent::RECOMPUTE: return "recompute";
    case v1::TraceEvent::ALL_REDUCE: return "all-reduce";
    default: return "other";
  }
}

bool IsCompute(v1::TraceEvent::Kind kind) {
  return kind != v1::TraceEvent::SEND && kind != v1::TraceEvent::RECEIVE && kind != v1::TraceEvent::ALL_REDUCE;
}

std::pair<int64_t, int64_t> Span(const v1::StepTrace& trace) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (const auto& st : trace.stages())
    for (const auto& e : st.events()) {
      lo = std::min(lo, e.start_us());
      hi = std::max(hi, e.end_us());
    }
  return {lo, hi};
}

std::vector<int64_t> StageStepUs(const v1::StepTrace& trace) {
  std::vector<int64_t> out;
  for (const auto& st : trace.stages()) out.push_back(st.step_us());
  return out;
}

}  // namespace

std::vector<double> IdleFractions(const v1::StepTrace& trace) {
  auto [lo, hi] = Span(trace);
  std::vector<double> out;
  for (const auto& st : trace.stages()) {
    int64_t busy = 0;
    for (const auto& e : st.events())
      if (IsCompute(e.kind())) busy += e.end_us() - e.start_us();
    out.push_back(hi > lo ? 1.0 - static_cast<double>(busy) / static_cast<double>(hi - lo) : 0.0);
  }
  return out;
}

nlohmann::json TraceToChrome(const v1::StepTrace& trace, double theoretical_idle) {
  auto [lo, hi] = Span(trace);
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0},
                    {"args", {{"name", trace.job_id() + " step " + std::to_string(trace.step()) + " (" +
                                           ScheduleName(trace.schedule()) + ")"}}}});
  for (const auto& st : trace.stages()) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", st.stage()},
                      {"args", {{"name", "stage " + std::to_string(st.stage())}}}});
    for (const auto& e : st.events()) {
      std::string name = KindName(e.kind());
      if (e.micro_batch() >= 0) {
        name = std::string(1, static_cast<char>(std::toupper(name[0]))) +
               (trace.virtual_stages() > 1 ? std::to_string(e.chunk()) + "." : "") + std::to_string(e.micro_batch());
        if (e.kind() == v1::TraceEvent::SEND || e.kind() == v1::TraceEvent::RECEIVE)
          name = std::string(KindName(e.kind())) + " " + name.substr(1);
      }
      events.push_back({{"name", name},
                        {"cat", KindName(e.kind())},
                        {"ph", "X"},
                        {"pid", 0},
                        {"tid", st.stage()},
                        {"ts", e.start_us() - lo},
                        {"dur", std::max<int64_t>(1, e.end_us() - e.start_us())},
                        {"args", {{"micro_batch", e.micro_batch()}, {"chunk", e.chunk()}}}});
    }
  }
  std::vector<double> idle = IdleFractions(trace);
  nlohmann::json meta = {{"job_id", trace.job_id()},
                         {"step", trace.step()},
                         {"schedule", ScheduleName(trace.schedule())},
                         {"micro_batches", trace.micro_batches()},
                         {"virtual_stages", trace.virtual_stages()},
                         {"step_us", hi - lo},
                         // Against the stages' and the coordinator's clocks: the
                         // time a step takes outside the actions traced.
                         {"stage_step_us", StageStepUs(trace)},
                         {"coordinator_step_us", trace.wall_us()},
                         {"between_steps_us", trace.since_previous_us()},
                         {"idle_fraction", idle},
                         {"theoretical_idle_fraction", theoretical_idle}};
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"metadata", meta}};
}

StatusOr<std::string> WriteTrace(const v1::StepTrace& trace, double theoretical_idle, const std::string& prefix) {
  const std::string json_path = prefix + ".json", png_path = prefix + ".png";
  {
    std::ofstream out(json_path);
    if (!out) return absl::PermissionDeniedError("cannot write " + json_path);
    out << TraceToChrome(trace, theoretical_idle).dump() << "\n";
  }
  std::ostringstream said;
  said << "step " << trace.step() << " of " << trace.job_id() << " (" << ScheduleName(trace.schedule()) << ", "
       << Plural(trace.micro_batches(), "micro-batch") << ")\n";
  std::vector<double> idle = IdleFractions(trace);
  for (std::size_t s = 0; s < idle.size(); ++s)
    said << "  stage " << s << " idle " << std::fixed << std::setprecision(1) << 100 * idle[s] << "%\n";
  said << "  theoretical bubble " << std::fixed << std::setprecision(1) << 100 * theoretical_idle << "%\n";
  said << "wrote " << json_path << " (open it in ui.perfetto.dev)";
  if (Status drawn = RunPlotScript("plot_timeline.py", "CONVEYOR_PLOT_SCRIPT", {json_path, png_path}); drawn.ok()) {
    said << " and " << png_path;
  } else {
    said << "\nno PNG: " << drawn.message();
  }
  return said.str();
}

}  // namespace conveyor::cli
