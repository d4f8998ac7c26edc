#include "model/exported/program.h"

#include <algorithm>

namespace conveyor::exported {

Status Bad(const Program& p, const std::string& what) {
  return absl::InvalidArgumentError("model.exported: " + p.path + ": " + what);
}

std::string WithoutBacktrace(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

std::optional<at::ScalarType> ScalarTypeOf(int code) {
  switch (code) {
    case 1: return at::kByte;
    case 2: return at::kChar;
    case 3: return at::kShort;
    case 4: return at::kInt;
    case 5: return at::kLong;
    case 6: return at::kHalf;
    case 7: return at::kFloat;
    case 8: return at::kDouble;
    case 12: return at::kBool;
    case 13: return at::kBFloat16;
    default: return std::nullopt;
  }
}

void CollectReads(const json& arg, std::vector<std::string>* out) {
  if (arg.contains("as_tensor")) out->push_back(arg.at("as_tensor").at("name").get<std::string>());
  if (arg.contains("as_tensors"))
    for (const json& t : arg.at("as_tensors")) out->push_back(t.at("name").get<std::string>());
  if (arg.contains("as_optional_tensors"))
    for (const json& t : arg.at("as_optional_tensors"))
      if (t.contains("as_tensor")) out->push_back(t.at("as_tensor").at("name").get<std::string>());
  if (arg.contains("as_optional_tensor") && arg.at("as_optional_tensor").contains("as_tensor"))
    out->push_back(arg.at("as_optional_tensor").at("as_tensor").at("name").get<std::string>());
}

std::size_t LayerOf(const Program& p, std::size_t i) {
  return static_cast<std::size_t>(std::upper_bound(p.starts.begin(), p.starts.end(), i) - p.starts.begin() - 1);
}

}  // namespace conveyor::exported
