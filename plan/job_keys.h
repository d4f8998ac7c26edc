// Every key a job file may hold, in one table: its dotted name, type,
// default, allowed values or range, where it applies, one line of doc, and how
// it is set on (and, for a number, read back from) a v1::JobSpec.
//
// The parser (ReadJobKeys) walks a job file's mappings against this table:
// an unknown key, a value of the wrong type, a name not among the allowed
// ones, a number out of range or a key where it does not apply is refused
// naming the key. ValidateJobSpec checks the ranges of a typed spec (one that
// arrived by gRPC) from the same table, and docs/jobs.md's key reference is
// JobKeysMarkdown()'s output (a test keeps the two equal). The rules between
// keys (micro-batches against the batch, stages against layers, ...) stay in
// ValidateJobSpec. Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "conveyor.pb.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace conveyor {

// What one key's value is, after YAML 1.2 core-schema typing.
enum class KeyType {
  kSection,     // a mapping of further keys (or, with a shorthand, one word)
  kInt,         // an integer
  kNumber,      // an integer or a float
  kBool,        // true or false
  kName,        // a plain word or a quoted string
  kPath,        // a file path (confined to the data roots when a job is placed)
  kChoice,      // one name of `choices`
  kIntList,     // a list of integers
  kNumberList,  // a list of numbers
  kCustom,      // read by its own function (a union of types)
};

// A value read from a job file, by its key's type.
struct KeyValue {
  int64_t integer = 0;  // kInt, and kChoice's enum value
  double number = 0;    // kNumber
  bool flag = false;    // kBool
  std::string text;     // kName, kPath, kChoice's name
  std::vector<int64_t> integers;
  std::vector<double> numbers;
};

struct JobKey {
  std::string key;  // dotted: "optimizer.lr"
  KeyType type = KeyType::kName;
  std::string doc;  // one line, markdown
  // kChoice: the names and their enum values; the first is not a default.
  std::vector<std::pair<std::string, int>> choices;
  // Applied before the file is read (YAML text, typed like a value); empty:
  // no default, or one that depends on other keys (default_doc says which).
  std::string default_value;
  std::string default_doc;  // for docs when it is not default_value
  // Numbers: inclusive range; `above_min` makes the minimum exclusive.
  bool has_range = false;
  double min = 0, max = 0;
  bool above_min = false;
  bool below_max = false;  // the maximum is exclusive
  bool required = false;  // docs mark it; the rule lives in ValidateJobSpec
  // kIntList/kNumberList: exact length (0: any).
  std::size_t list_length = 0;
  // kSection: a bare word stands for {shorthand: word} (`model: convnet`).
  std::string shorthand;
  // What a wrong-typed value was expected to be ("an integer"); derived
  // from the type when empty.
  std::string expect;
  // Where the key applies ("format: tokens"), and the test of it on the
  // spec as read so far; a key given where it does not apply is refused.
  std::string only_doc;
  std::function<bool(const v1::JobSpec&)> only;
  std::function<Status(const KeyValue&, v1::JobSpec*)> set;
  // Numbers with a range: the value on a typed spec, for ValidateJobSpec.
  std::function<double(const v1::JobSpec&)> get;
  // kCustom: reads the node itself into the spec.
  std::function<Status(const YAML::Node&, v1::JobSpec*)> read;
};

// The table, sections before their keys, in the order docs/jobs.md lists them.
const std::vector<JobKey>& JobKeys();
// nullptr for an unknown key.
const JobKey* FindJobKey(const std::string& dotted);
// " (did you mean optimizer.lr?)" for the known key nearest an unknown
// dotted one, where one is near enough; "" otherwise.
std::string NearestJobKeyHint(const std::string& dotted);

// Reads a job file's root mapping into `spec` (defaults first, then every
// key by the table). `present` receives the dotted keys the file gave.
// INVALID_ARGUMENT naming the key.
Status ReadJobKeys(const YAML::Node& root, v1::JobSpec* spec, std::set<std::string>* present);

// The table as docs/jobs.md's key reference: a markdown table.
std::string JobKeysMarkdown();

// The ranges of every numeric key with a `get`, on a typed spec.
Status CheckKeyRanges(const v1::JobSpec& spec);

// The allowed names of a kChoice key, for messages and name lookups
// ("gpipe", v1::SCHEDULE_GPIPE); empty for another key.
const std::vector<std::pair<std::string, int>>& KeyChoices(const std::string& dotted);

}  // namespace conveyor
