#include "bench/load/load_stats.h"

#include <algorithm>
#include <cmath>
#include <iomanip>

namespace conveyor::bench {

std::string CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "CODE_" + std::to_string(i);
}

void LoadStats::Add(const std::string& method, double seconds, const grpc::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  Method& m = methods_[method];
  if (status.ok()) {
    m.seconds.push_back(seconds);
  } else {
    ++m.errors[status.error_code()];
  }
}

int64_t LoadStats::Calls(const std::string& method) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = methods_.find(method);
  if (it == methods_.end()) return 0;
  int64_t n = static_cast<int64_t>(it->second.seconds.size());
  for (const auto& [code, count] : it->second.errors) n += count;
  return n;
}

int64_t LoadStats::Ok(const std::string& method) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = methods_.find(method);
  return it == methods_.end() ? 0 : static_cast<int64_t>(it->second.seconds.size());
}

namespace {

// The q-quantile (0..1) of sorted `v`, nearest rank.
double Quantile(const std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace

void LoadStats::Print(std::ostream& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  out << std::left << std::setw(26) << "call" << std::right << std::setw(8) << "ok" << std::setw(10) << "p50 ms"
      << std::setw(10) << "p99 ms" << std::setw(10) << "max ms" << "  errors\n";
  for (const auto& [name, m] : methods_) {
    std::vector<double> s = m.seconds;
    std::sort(s.begin(), s.end());
    std::string errors;
    for (const auto& [code, count] : m.errors)
      errors += (errors.empty() ? "" : ", ") + CodeName(code) + " " + std::to_string(count);
    out << std::left << std::setw(26) << name << std::right << std::setw(8) << s.size() << std::fixed
        << std::setprecision(2) << std::setw(10) << Quantile(s, 0.5) * 1e3 << std::setw(10) << Quantile(s, 0.99) * 1e3
        << std::setw(10) << (s.empty() ? 0.0 : s.back() * 1e3) << "  " << (errors.empty() ? "none" : errors) << "\n";
  }
}

std::vector<std::string> LoadStats::Unexpected(const std::set<grpc::StatusCode>& allowed) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [name, m] : methods_) {
    for (const auto& [code, count] : m.errors) {
      if (!allowed.count(code)) out.push_back(name + " " + CodeName(code) + ": " + std::to_string(count));
    }
  }
  return out;
}

}  // namespace conveyor::bench
