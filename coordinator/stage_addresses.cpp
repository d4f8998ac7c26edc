#include "coordinator/stage_addresses.h"

#include <algorithm>
#include <cstdint>

#include "common/net.h"

namespace conveyor {
namespace {

Status Bad(const std::string& item, const std::string& why) {
  return absl::InvalidArgumentError("--stages: '" + item + "': " + why);
}

// A bound of a range: decimal digits only, small enough to count to.
bool ParseBound(const std::string& text, int64_t* value) {
  if (text.empty() || text.size() > 9) return false;
  *value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    *value = *value * 10 + (c - '0');
  }
  return true;
}

std::string Padded(int64_t n, std::size_t width) {
  std::string s = std::to_string(n);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

Status ExpandOne(const std::string& item, std::vector<std::string>* out) {
  const std::size_t open = item.find('{');
  const std::size_t close = item.find('}');
  if (open == std::string::npos && close == std::string::npos) {
    out->push_back(item);
    return absl::OkStatus();
  }
  if (open == std::string::npos || close == std::string::npos || close < open)
    return Bad(item, "a '{' and a '}' must enclose a range such as {0..3}");
  if (item.find_first_of("{}", close + 1) != std::string::npos || item.find('{', open + 1) < close)
    return Bad(item, "one {A..B} range per address; list further ones separated by commas");
  const std::string range = item.substr(open + 1, close - open - 1);
  const std::size_t dots = range.find("..");
  int64_t first = 0, last = 0;
  if (dots == std::string::npos || !ParseBound(range.substr(0, dots), &first) ||
      !ParseBound(range.substr(dots + 2), &last))
    return Bad(item, "{" + range + "} is not a range of stage numbers such as {0..3}");
  if (last < first)
    return Bad(item, "{" + range + "} counts down; write {" + std::to_string(last) + ".." + std::to_string(first) +
                         "} (stages are listed in pipeline order)");
  if (last - first + 1 + static_cast<int64_t>(out->size()) > kMaxStageAddresses)
    return Bad(item, "more than " + std::to_string(kMaxStageAddresses) + " stage addresses");
  const std::string a = range.substr(0, dots), b = range.substr(dots + 2);
  const bool pad = (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
  const std::size_t width = pad ? std::max(a.size(), b.size()) : 0;
  for (int64_t i = first; i <= last; ++i)
    out->push_back(item.substr(0, open) + Padded(i, width) + item.substr(close + 1));
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::vector<std::string>> ExpandStageAddresses(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const auto& item : items) {
    const std::size_t before = out.size();
    CONVEYOR_RETURN_IF_ERROR(ExpandOne(item, &out));
    for (std::size_t i = before; i < out.size(); ++i) {
      Status st = CheckAddress(out[i], "--stages");
      if (!st.ok() && out.size() - before > 1) return Bad(item, "expands to " + out[i] + ": " + std::string(st.message()));
      if (!st.ok()) return st;
    }
  }
  if (out.size() > static_cast<std::size_t>(kMaxStageAddresses))
    return absl::InvalidArgumentError("--stages: more than " + std::to_string(kMaxStageAddresses) + " stage addresses");
  return out;
}

}  // namespace conveyor
