// Step timelines: Chrome/Perfetto trace JSON (opens in ui.perfetto.dev) and a
// PNG drawn by cli/plot_timeline.py with matplotlib.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "common/status.h"
#include "conveyor.pb.h"

namespace conveyor::cli {

// Chrome trace events, one thread row per stage, times relative to the
// step's first event; "metadata" holds each stage's measured idle fraction.
nlohmann::json TraceToChrome(const v1::StepTrace& trace, double theoretical_idle);

// Each stage's idle fraction of the step: 1 - compute time / the step's span.
std::vector<double> IdleFractions(const v1::StepTrace& trace);

// Writes PREFIX.json and, where python3 with matplotlib is found, PREFIX.png.
// Returns what was written, for the user.
StatusOr<std::string> WriteTrace(const v1::StepTrace& trace, double theoretical_idle, const std::string& prefix);

}  // namespace conveyor::cli
