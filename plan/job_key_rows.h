// What job_keys.cpp and its groups of keys (job_keys_<group>.cpp) share: the
// YAML 1.2 core-schema reading of a scalar, the builder of one row of the key
// table, and the functions that add each group's rows, in the order
// docs/jobs.md lists them. Internal to plan/: the table itself is JobKeys()
// (job_keys.h).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"
#include "plan/job_keys.h"

namespace conveyor::job_keys_internal {

Status Invalid(const std::string& msg);

// How a plain or quoted YAML scalar is typed (job_keys.cpp's Resolve).
enum class Scalar { kNull, kBool, kInt, kFloat, kString };
Scalar Resolve(const YAML::Node& node);
// A value as a message names it ("the integer 3", "a list").
std::string Show(const YAML::Node& node);
// False where the node is not a scalar of that type.
bool ReadScalar(const YAML::Node& node, std::string* out);
bool ReadScalar(const YAML::Node& node, bool* out);
bool ReadScalar(const YAML::Node& node, double* out);
bool ReadScalar(const YAML::Node& node, int64_t* out);


// Builds one row; each setter names what it fills.
class Row {
 public:
  Row(std::string key, KeyType type, std::string doc) {
    k_.key = std::move(key);
    k_.type = type;
    k_.doc = std::move(doc);
  }
  Row& Default(std::string yaml) {
    k_.default_value = std::move(yaml);
    return *this;
  }
  Row& DefaultDoc(std::string doc) {
    k_.default_doc = std::move(doc);
    return *this;
  }
  Row& Range(double lo, double hi = 1e308, bool above_lo = false, bool below_hi = false) {
    k_.has_range = true;
    k_.min = lo;
    k_.max = hi;
    k_.above_min = above_lo;
    k_.below_max = below_hi;
    return *this;
  }
  Row& Positive(double hi = 1e308) { return Range(0, hi, true); }
  Row& Choices(std::vector<std::pair<std::string, int>> choices) {
    k_.choices = std::move(choices);
    return *this;
  }
  Row& Required() {
    k_.required = true;
    return *this;
  }
  Row& Length(std::size_t n) {
    k_.list_length = n;
    return *this;
  }
  Row& Shorthand(std::string key) {
    k_.shorthand = std::move(key);
    return *this;
  }
  Row& Expect(std::string what) {
    k_.expect = std::move(what);
    return *this;
  }
  Row& Only(std::string doc, std::function<bool(const v1::JobSpec&)> test) {
    k_.only_doc = std::move(doc);
    k_.only = std::move(test);
    return *this;
  }
  Row& Set(std::function<void(const KeyValue&, v1::JobSpec*)> set) {
    k_.set = [set = std::move(set)](const KeyValue& v, v1::JobSpec* s) {
      set(v, s);
      return absl::OkStatus();
    };
    return *this;
  }
  Row& Get(std::function<double(const v1::JobSpec&)> get) {
    k_.get = std::move(get);
    return *this;
  }
  Row& Read(std::function<Status(const YAML::Node&, v1::JobSpec*)> read) {
    k_.read = std::move(read);
    return *this;
  }
  JobKey Take() { return std::move(k_); }

 private:
  JobKey k_;
};

using S = v1::JobSpec;
using V = KeyValue;

inline constexpr KeyType kInt = KeyType::kInt, kNumber = KeyType::kNumber, kBool = KeyType::kBool,
                         kName = KeyType::kName, kPath = KeyType::kPath, kChoice = KeyType::kChoice,
                         kSection = KeyType::kSection;

template <typename E>
std::vector<std::pair<std::string, int>> Names(std::initializer_list<std::pair<const char*, E>> list) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [n, e] : list) out.emplace_back(n, static_cast<int>(e));
  return out;
}

// The rows as they are added: add("key", type, "doc").Default(...)...
class Table {
 public:
  Row& operator()(std::string key, KeyType type, std::string doc) {
    rows_.emplace_back(std::move(key), type, std::move(doc));
    return rows_.back();
  }
  std::vector<JobKey> Take() {
    std::vector<JobKey> table;
    table.reserve(rows_.size());
    for (Row& r : rows_) table.push_back(r.Take());
    return table;
  }

 private:
  std::vector<Row> rows_;
};

// The groups of keys, each in its file; job_keys.cpp calls them in this order.
void AddModelSourceKeys(Table& add);  // job_keys_model.cpp
void AddModelShapeKeys(Table& add);   // job_keys_model.cpp
void AddPartitionKeys(Table& add);    // job_keys_model.cpp
void AddDataKeys(Table& add);         // job_keys_data.cpp
void AddScheduleKeys(Table& add);     // job_keys_schedule.cpp
void AddOptimizerKeys(Table& add);    // job_keys_optimizer.cpp
void AddLrScheduleKeys(Table& add);   // job_keys_optimizer.cpp
void AddLossKeys(Table& add);         // job_keys_loss.cpp
void AddRunKeys(Table& add);          // job_keys_run.cpp
void AddLinkKeys(Table& add);         // job_keys_devices.cpp
void AddDeviceKeys(Table& add);       // job_keys_devices.cpp
void AddRecoveryKeys(Table& add);     // job_keys_recovery.cpp

}  // namespace conveyor::job_keys_internal
