#include "plan/job_overrides.h"

#include <yaml-cpp/yaml.h>

#include "plan/job_keys.h"

namespace conveyor {
namespace {

std::vector<std::string> Split(const std::string& dotted) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t dot = dotted.find('.', start);
    parts.push_back(dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

// Writes `node` as it was read, quotes included: yaml-cpp's own emitter drops
// them, and a quoted "14" (a name, say model.cut_before) would be read back as
// the integer 14.
void Emit(const YAML::Node& node, YAML::Emitter& out) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      if (node.Style() == YAML::EmitterStyle::Flow) out << YAML::Flow;
      out << YAML::BeginMap;
      for (const auto& kv : node) {
        out << YAML::Key;
        Emit(kv.first, out);
        out << YAML::Value;
        Emit(kv.second, out);
      }
      out << YAML::EndMap;
      break;
    case YAML::NodeType::Sequence:
      if (node.Style() == YAML::EmitterStyle::Flow) out << YAML::Flow;
      out << YAML::BeginSeq;
      for (const auto& item : node) Emit(item, out);
      out << YAML::EndSeq;
      break;
    case YAML::NodeType::Scalar:
      if (node.Tag() == "!") out << YAML::DoubleQuoted;  // quoted where it was read
      out << node.Scalar();
      break;
    default:
      out << YAML::Null;
  }
}

}  // namespace

StatusOr<std::string> ApplyJobOverrides(const std::string& yaml_text, const std::vector<std::string>& sets) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(std::string("the job file is not YAML: ") + e.what());
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) return absl::InvalidArgumentError("the job file is not a mapping of keys");
  for (const std::string& set : sets) {
    const std::size_t eq = set.find('=');
    const std::string what = "--set '" + set + "'";
    if (eq == std::string::npos || eq == 0)
      return absl::InvalidArgumentError(what + ": expected KEY=VALUE, e.g. --set optimizer.lr=0.01");
    const std::string key = set.substr(0, eq), text = set.substr(eq + 1);
    if (!FindJobKey(key)) {
      return absl::InvalidArgumentError(what + ": unknown key " + key + NearestJobKeyHint(key) +
                                        " (`conveyor keys` lists them)");
    }
    YAML::Node value;
    try {
      value = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(what + ": the value is not YAML: " + e.what());
    }
    if (value.IsNull()) return absl::InvalidArgumentError(what + ": no value after '='");
    const std::vector<std::string> parts = Split(key);
    // Down the sections, made where the file has none. yaml-cpp's nodes are
    // handles: `node.reset(child)` moves the handle, assignment would write.
    YAML::Node node = root;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      YAML::Node child = node[parts[i]];
      if (child.IsScalar()) {  // the one-word shorthand: `model: gpt`
        YAML::Node section(YAML::NodeType::Map);
        section["name"] = child.Scalar();
        node[parts[i]] = section;
        child = node[parts[i]];
      } else if (!child.IsDefined() || child.IsNull()) {
        node[parts[i]] = YAML::Node(YAML::NodeType::Map);
        child = node[parts[i]];
      } else if (!child.IsMap()) {
        return absl::InvalidArgumentError(what + ": " + parts[i] + " in the job file is not a section of keys");
      }
      node.reset(child);
    }
    node[parts.back()] = value;
  }
  YAML::Emitter out;
  Emit(root, out);
  if (!out.good()) return absl::InternalError("writing the effective job: " + out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

}  // namespace conveyor
