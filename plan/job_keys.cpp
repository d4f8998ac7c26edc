// The job-key table (job_keys.h) put together and read: YAML 1.2 scalar typing,
// a value read and range-checked by its key, the table made from its groups of
// rows (job_keys_<group>.cpp, in docs/jobs.md's order), lookups with a
// "did you mean", job files read against it, and its markdown for docs/jobs.md.
#include "plan/job_keys.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <regex>
#include <sstream>

#include "plan/job_key_rows.h"

namespace conveyor {
namespace job_keys_internal {

Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// ---------------------------------------------------------------------------
// YAML 1.2 core-schema typing, the one typing rule of job files: a quoted
// scalar is a string; a plain one is null, a bool (true, false), an integer
// (decimal, 0o octal, 0x hex), a float, or else a string. yaml-cpp itself
// would read "1", yes and on as numbers and bools.

Scalar Resolve(const YAML::Node& node) {
  if (node.Tag() != "?") return Scalar::kString;  // quoted ("!") or explicitly tagged
  const std::string& v = node.Scalar();
  if (v.empty() || v == "~" || v == "null" || v == "Null" || v == "NULL") return Scalar::kNull;
  if (v == "true" || v == "True" || v == "TRUE" || v == "false" || v == "False" || v == "FALSE") return Scalar::kBool;
  static const std::regex kInt("[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+");
  static const std::regex kFloat(
      "[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)");
  if (std::regex_match(v, kInt)) return Scalar::kInt;
  if (std::regex_match(v, kFloat)) return Scalar::kFloat;
  return Scalar::kString;
}

std::string Show(const YAML::Node& node) {
  if (node.IsScalar()) {
    switch (Resolve(node)) {
      case Scalar::kNull: return "nothing";
      case Scalar::kBool: return "the bool " + node.Scalar();
      case Scalar::kInt: return "the integer " + node.Scalar();
      case Scalar::kFloat: return "the number " + node.Scalar();
      case Scalar::kString:
        return node.Tag() == "?" ? "'" + node.Scalar() + "'" : "the string \"" + node.Scalar() + "\" (quoted, so a string)";
    }
  }
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
}

bool ReadScalar(const YAML::Node& node, std::string* out) {
  if (!node.IsScalar() || Resolve(node) != Scalar::kString) return false;
  *out = node.Scalar();
  return true;
}

bool ReadScalar(const YAML::Node& node, bool* out) {
  if (!node.IsScalar() || Resolve(node) != Scalar::kBool) return false;
  *out = node.Scalar()[0] == 't' || node.Scalar()[0] == 'T';
  return true;
}

bool ReadScalar(const YAML::Node& node, double* out) {
  if (!node.IsScalar()) return false;
  const Scalar kind = Resolve(node);
  if (kind != Scalar::kInt && kind != Scalar::kFloat) return false;
  const std::string& v = node.Scalar();
  if (v.find("inf") != std::string::npos || v.find("Inf") != std::string::npos || v.find("INF") != std::string::npos) {
    *out = v[0] == '-' ? -HUGE_VAL : HUGE_VAL;
  } else if (v.find_first_of("nN") != std::string::npos) {
    *out = std::nan("");
  } else if (kind == Scalar::kInt && v.size() > 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'o')) {
    *out = static_cast<double>(std::strtoull(v.c_str() + 2, nullptr, v[1] == 'x' ? 16 : 8));
  } else {
    *out = std::strtod(v.c_str(), nullptr);
  }
  return true;
}

bool ReadScalar(const YAML::Node& node, int64_t* out) {
  if (!node.IsScalar() || Resolve(node) != Scalar::kInt) return false;
  const std::string& v = node.Scalar();
  errno = 0;
  long double value = 0;
  if (v.size() > 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'o')) {
    value = static_cast<long double>(std::strtoull(v.c_str() + 2, nullptr, v[1] == 'x' ? 16 : 8));
  } else {
    value = static_cast<long double>(std::strtoll(v.c_str(), nullptr, 10));
  }
  if (errno == ERANGE || value < static_cast<long double>(std::numeric_limits<int64_t>::min()) ||
      value > static_cast<long double>(std::numeric_limits<int64_t>::max()))
    return false;
  *out = static_cast<int64_t>(value);
  return true;
}

}  // namespace job_keys_internal

using namespace job_keys_internal;  // NOLINT: this file and the key groups share them

namespace {

std::string ShowNumber(double v) {
  std::ostringstream out;
  if (std::isfinite(v) && std::fabs(v) < 1e15 && v == std::floor(v)) {
    out << static_cast<int64_t>(v);
  } else {
    out << v;
  }
  return out.str();
}

std::string ChoiceList(const JobKey& k) {
  std::string choices;
  for (const auto& [name, value] : k.choices) choices += (choices.empty() ? "" : ", ") + name;
  return choices;
}

std::string Expected(const JobKey& k) {
  if (!k.expect.empty()) return k.expect;
  switch (k.type) {
    case KeyType::kSection: return k.shorthand.empty() ? "a mapping" : "a name or a mapping";
    case KeyType::kInt: return "an integer";
    case KeyType::kNumber: return "a number";
    case KeyType::kBool: return "true or false";
    case KeyType::kName: return "a name";
    case KeyType::kPath: return "a path";
    case KeyType::kChoice: return "one of: " + ChoiceList(k);
    case KeyType::kIntList: return "a list of integers";
    case KeyType::kNumberList:
      return k.list_length ? "a list of " + std::to_string(k.list_length) + " numbers" : "a list of numbers";
    case KeyType::kCustom: return "a value";
  }
  return "a value";
}

Status CheckRange(const JobKey& k, double v) {
  if (!k.has_range) return absl::OkStatus();
  const bool low = k.above_min ? !(v > k.min) : !(v >= k.min);
  if (!low && (k.below_max ? v < k.max : v <= k.max)) return absl::OkStatus();
  std::string want;
  const bool unbounded = k.max >= 1e300;
  if (k.below_max) {
    want = std::string(k.above_min ? "must be more than " : "must be at least ") + ShowNumber(k.min) +
           " and less than " + ShowNumber(k.max);
  } else if (k.above_min && k.min == 0 && unbounded) {
    want = "must be positive";
  } else if (k.above_min) {
    want = "must be more than " + ShowNumber(k.min) + (unbounded ? "" : " and at most " + ShowNumber(k.max));
  } else if (unbounded) {
    want = "must be at least " + ShowNumber(k.min);
  } else {
    want = "must be between " + ShowNumber(k.min) + " and " + ShowNumber(k.max);
  }
  return Invalid(k.key + ": " + want + ", got " + ShowNumber(v));
}

// Reads `node` as `k`'s type into `value`; INVALID_ARGUMENT naming the key.
Status ReadValue(const JobKey& k, const YAML::Node& node, KeyValue* value) {
  auto wrong = [&]() { return Invalid(k.key + ": expected " + Expected(k) + ", got " + Show(node)); };
  switch (k.type) {
    case KeyType::kInt:
      if (!ReadScalar(node, &value->integer)) return wrong();
      return CheckRange(k, static_cast<double>(value->integer));
    case KeyType::kNumber:
      if (!ReadScalar(node, &value->number)) return wrong();
      return CheckRange(k, value->number);
    case KeyType::kBool:
      if (!ReadScalar(node, &value->flag)) return wrong();
      return absl::OkStatus();
    case KeyType::kName:
    case KeyType::kPath:
      if (!ReadScalar(node, &value->text)) return wrong();
      if (k.type == KeyType::kPath && value->text.empty()) return Invalid(k.key + ": empty path");
      return absl::OkStatus();
    case KeyType::kChoice:
      if (!ReadScalar(node, &value->text)) {
        return Invalid(k.key + ": expected " + (k.expect.empty() ? "a name" : k.expect) + ", got " + Show(node));
      }
      for (const auto& [name, e] : k.choices) {
        if (name == value->text) {
          value->integer = e;
          return absl::OkStatus();
        }
      }
      return Invalid(k.key + ": unknown value '" + value->text + "' (one of: " + ChoiceList(k) + ")");
    case KeyType::kIntList:
    case KeyType::kNumberList: {
      if (!node.IsSequence() || (k.list_length && node.size() != k.list_length)) return wrong();
      for (std::size_t i = 0; i < node.size(); ++i) {
        int64_t integer = 0;
        double number = 0;
        const bool ok = k.type == KeyType::kIntList ? ReadScalar(node[i], &integer) : ReadScalar(node[i], &number);
        if (!ok) {
          return Invalid(k.key + ": item " + std::to_string(i) + ": expected " +
                         (k.type == KeyType::kIntList ? "an integer" : "a number") + ", got " + Show(node[i]));
        }
        if (k.type == KeyType::kIntList) {
          value->integers.push_back(integer);
        } else {
          CONVEYOR_RETURN_IF_ERROR(CheckRange(k, number));
          value->numbers.push_back(number);
        }
      }
      return absl::OkStatus();
    }
    case KeyType::kSection:
    case KeyType::kCustom: break;
  }
  return Invalid(k.key + ": cannot be read");
}

// ---------------------------------------------------------------------------
// The table, its rows in the order docs/jobs.md lists them (the groups are in
// job_keys_<group>.cpp).

std::vector<JobKey> MakeTable() {
  Table add;
  AddModelSourceKeys(add);
  AddModelShapeKeys(add);
  AddPartitionKeys(add);
  AddDataKeys(add);
  AddScheduleKeys(add);
  AddOptimizerKeys(add);
  AddLrScheduleKeys(add);
  AddLossKeys(add);
  AddRunKeys(add);
  AddLinkKeys(add);
  AddDeviceKeys(add);
  AddRecoveryKeys(add);
  return add.Take();
}

const std::map<std::string, const JobKey*>& Index() {
  static const auto* index = [] {
    auto* m = new std::map<std::string, const JobKey*>;
    for (const JobKey& k : JobKeys()) (*m)[k.key] = &k;
    return m;
  }();
  return *index;
}

std::string Parent(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? "" : key.substr(0, dot);
}

std::string KnownKeys(const std::string& section) {
  std::string known;
  for (const JobKey& k : JobKeys()) {
    if (Parent(k.key) != section) continue;
    known += (known.empty() ? "" : ", ") + k.key.substr(section.empty() ? 0 : section.size() + 1);
  }
  return known;
}

// Edits (insertions, deletions, substitutions, swaps of neighbours) from a to b.
std::size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// " (did you mean KEY?)" for the key of `section` nearest to `name`, where one
// is near enough (a third of its letters at most, or a dropped underscore).
std::string DidYouMean(const std::string& section, const std::string& name) {
  std::string best;
  std::size_t best_d = std::string::npos;
  for (const JobKey& k : JobKeys()) {
    if (Parent(k.key) != section) continue;
    const std::string key = k.key.substr(section.empty() ? 0 : section.size() + 1);
    std::string bare = key;
    bare.erase(std::remove(bare.begin(), bare.end(), '_'), bare.end());
    // A key whose length differs by more than the edits allowed cannot be
    // near enough (and a long unknown key would cost its length squared).
    const std::size_t allowed = std::max<std::size_t>(1, key.size() / 3);
    const std::size_t gap = name.size() > key.size() ? name.size() - key.size() : key.size() - name.size();
    if (bare != name && gap > allowed) continue;
    const std::size_t d = bare == name ? 0 : EditDistance(name, key);
    if (d < best_d) {
      best_d = d;
      best = key;
    }
  }
  if (best.empty() || best_d > std::max<std::size_t>(1, best.size() / 3)) return "";
  return " (did you mean " + best + "?)";
}

// Reads one mapping's keys (file order) into `spec`.
Status ReadMapping(const YAML::Node& node, const std::string& section, v1::JobSpec* spec,
                   std::set<std::string>* present) {
  for (const auto& kv : node) {
    std::string name;
    if (!kv.first.IsScalar() || !ReadScalar(kv.first, &name)) {
      return Invalid((section.empty() ? "job" : section) + ": a key must be a word, got " + Show(kv.first));
    }
    const std::string dotted = section.empty() ? name : section + "." + name;
    const JobKey* k = FindJobKey(dotted);
    if (k == nullptr) {
      const std::string hint = DidYouMean(section, name);
      return Invalid(dotted + ": unknown key" + (hint.empty() ? " (known here: " + KnownKeys(section) + ")" : hint));
    }
    const YAML::Node& value = kv.second;
    if (!value.IsDefined() || value.IsNull()) continue;  // absent, as if not written
    present->insert(dotted);
    if (k->type == KeyType::kSection) {
      if (value.IsMap()) {
        CONVEYOR_RETURN_IF_ERROR(ReadMapping(value, dotted, spec, present));
        continue;
      }
      const JobKey* shorthand = k->shorthand.empty() ? nullptr : FindJobKey(dotted + "." + k->shorthand);
      std::string word;
      if (shorthand == nullptr || !ReadScalar(value, &word))
        return Invalid(dotted + ": expected " + Expected(*k) + ", got " + Show(value));
      present->insert(shorthand->key);
      KeyValue v;
      CONVEYOR_RETURN_IF_ERROR(ReadValue(*shorthand, value, &v));
      CONVEYOR_RETURN_IF_ERROR(shorthand->set(v, spec));
      continue;
    }
    if (k->type == KeyType::kCustom) {
      CONVEYOR_RETURN_IF_ERROR(k->read(value, spec));
      continue;
    }
    KeyValue v;
    CONVEYOR_RETURN_IF_ERROR(ReadValue(*k, value, &v));
    CONVEYOR_RETURN_IF_ERROR(k->set(v, spec));
  }
  return absl::OkStatus();
}

std::string Cell(std::string text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += "\\|";
    else out += c;
  }
  return out;
}

}  // namespace

const std::vector<JobKey>& JobKeys() {
  static const auto* table = new std::vector<JobKey>(MakeTable());
  return *table;
}

std::string NearestJobKeyHint(const std::string& dotted) {
  const std::string section = Parent(dotted);
  const std::string name = dotted.substr(section.empty() ? 0 : section.size() + 1);
  std::string hint = DidYouMean(section, name);
  if (!section.empty() && !hint.empty()) hint.insert(hint.find("mean ") + 5, section + ".");
  return hint;
}

const JobKey* FindJobKey(const std::string& dotted) {
  const auto& index = Index();
  const auto it = index.find(dotted);
  return it == index.end() ? nullptr : it->second;
}

const std::vector<std::pair<std::string, int>>& KeyChoices(const std::string& dotted) {
  static const std::vector<std::pair<std::string, int>> kNone;
  const JobKey* k = FindJobKey(dotted);
  return k ? k->choices : kNone;
}

namespace {

// Every key's default applied to an empty spec: read once, not per job file.
const StatusOr<v1::JobSpec>& Defaults() {
  static const auto* defaults = new StatusOr<v1::JobSpec>([]() -> StatusOr<v1::JobSpec> {
    v1::JobSpec spec;
    for (const JobKey& k : JobKeys()) {
      if (k.default_value.empty()) continue;
      KeyValue v;
      const Status read = ReadValue(k, YAML::Load(k.default_value), &v);
      if (!read.ok()) return absl::InternalError("job key table: default of " + read.ToString());
      CONVEYOR_RETURN_IF_ERROR(k.set(v, &spec));
    }
    return spec;
  }());
  return *defaults;
}

}  // namespace

Status ReadJobKeys(const YAML::Node& root, v1::JobSpec* spec, std::set<std::string>* present) {
  CONVEYOR_RETURN_IF_ERROR(Defaults().status());
  spec->MergeFrom(*Defaults());  // the defaults are scalars: nothing repeated is appended
  CONVEYOR_RETURN_IF_ERROR(ReadMapping(root, "", spec, present));
  // A key is refused where it does not apply, judged on the spec as read
  // (keys may come in any order within a mapping).
  for (const std::string& dotted : *present) {
    const JobKey* k = FindJobKey(dotted);
    if (k->only && !k->only(*spec)) return Invalid(dotted + ": only with " + k->only_doc);
  }
  return absl::OkStatus();
}

Status CheckKeyRanges(const v1::JobSpec& spec) {
  for (const JobKey& k : JobKeys()) {
    if (!k.get || !k.has_range) continue;
    if (k.only && !k.only(spec)) continue;
    const double v = k.get(spec);
    // Without a default, 0 on a typed spec is "not given".
    if (k.default_value.empty() && v == 0) continue;
    CONVEYOR_RETURN_IF_ERROR(CheckRange(k, v));
  }
  return absl::OkStatus();
}

std::string JobKeysMarkdown() {
  std::string out = "| key | type | default | meaning |\n| --- | --- | --- | --- |\n";
  for (const JobKey& k : JobKeys()) {
    std::string type;
    switch (k.type) {
      case KeyType::kSection: type = "mapping"; break;
      case KeyType::kInt: type = "integer"; break;
      case KeyType::kNumber: type = "number"; break;
      case KeyType::kBool: type = "bool"; break;
      case KeyType::kName: type = "name"; break;
      case KeyType::kPath: type = "path"; break;
      case KeyType::kChoice: {
        for (const auto& [name, e] : k.choices) type += (type.empty() ? "" : " | ") + ("`" + name + "`");
        break;
      }
      case KeyType::kIntList: type = "list of integers"; break;
      case KeyType::kNumberList:
        type = k.list_length ? "list of " + std::to_string(k.list_length) + " numbers" : "list of numbers";
        break;
      case KeyType::kCustom: type = k.expect; break;
    }
    if (k.has_range && k.type != KeyType::kNumberList) {
      const bool unbounded = k.max >= 1e300;
      if (k.above_min && k.min == 0 && unbounded) {
        type += ", > 0";
      } else {
        type += std::string(", ") + (k.above_min ? "> " : "") + ShowNumber(k.min) +
                (unbounded ? " or more" : (k.below_max ? " to < " : " to ") + ShowNumber(k.max));
      }
    }
    std::string def = !k.default_doc.empty() ? k.default_doc : k.default_value.empty() ? "" : "`" + k.default_value + "`";
    std::string doc = k.doc;
    if (!k.only_doc.empty()) doc += " (only with " + k.only_doc + ")";
    out += "| `" + k.key + "`" + (k.required ? " (required)" : "") + " | " + Cell(type) + " | " + Cell(def) + " | " +
           Cell(doc) + " |\n";
  }
  return out;
}

}  // namespace conveyor