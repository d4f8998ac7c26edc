#include "plan/job_keys.h"
#include "plan/model_catalog.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <regex>
#include <sstream>
#include <type_traits>

#include "plan/job_spec.h"

namespace conveyor {
namespace {

Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// ---------------------------------------------------------------------------
// YAML 1.2 core-schema typing, the one typing rule of job files: a quoted
// scalar is a string; a plain one is null, a bool (true, false), an integer
// (decimal, 0o octal, 0x hex), a float, or else a string. yaml-cpp itself
// would read "1", yes and on as numbers and bools.

enum class Scalar { kNull, kBool, kInt, kFloat, kString };

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
// The table.

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

template <typename E>
std::vector<std::pair<std::string, int>> Names(std::initializer_list<std::pair<const char*, E>> list) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [n, e] : list) out.emplace_back(n, static_cast<int>(e));
  return out;
}

bool ZooModel(const S& s, v1::ModelKind kind) { return s.model().kind() == kind; }
bool FileData(const S& s) { return s.data().kind() == v1::DATA_TENSORS || s.data().kind() == v1::DATA_TOKENS; }

Status ReadCarveout(const YAML::Node& node, S* s) {
  int64_t sms = 0;
  std::string word;
  const bool number = ReadScalar(node, &sms);
  if (!number) ReadScalar(node, &word);
  if (word == "auto") {
    s->set_matmul_sm_carveout(v1::SM_CARVEOUT_AUTO);
  } else if (word == "off") {
    s->set_matmul_sm_carveout(v1::SM_CARVEOUT_OFF);
  } else {
    if (!number || sms < 1 || sms > 64)
      return Invalid("matmul_sm_carveout: expected auto, off or a number of SMs from 1 to 64, got " + Show(node));
    s->set_matmul_sm_carveout(v1::SM_CARVEOUT_FIXED);
    s->set_matmul_sm_carveout_sms(static_cast<int32_t>(sms));
  }
  return absl::OkStatus();
}

// cuda_graphs: true, false, or auto (left unset: plan/job_spec.h's CudaGraphsFor).
Status ReadCudaGraphs(const YAML::Node& node, S* s) {
  std::string word;
  if (ReadScalar(node, &word) && word == "auto") {
    s->clear_cuda_graphs();
  } else if (node.IsScalar() && Resolve(node) == Scalar::kBool) {
    const std::string& v = node.Scalar();
    s->set_cuda_graphs(v == "true" || v == "True" || v == "TRUE");
  } else {
    return Invalid("cuda_graphs: expected auto, true or false, got " + Show(node));
  }
  return absl::OkStatus();
}

Status ReadRecompute(const YAML::Node& node, S* s) {
  if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i) {
      int64_t stage = 0;
      if (!ReadScalar(node[i], &stage) || stage < 0 || stage > std::numeric_limits<int32_t>::max())
        return Invalid("recompute: item " + std::to_string(i) + ": expected a stage index, got " + Show(node[i]));
      s->add_recompute_stages(static_cast<int32_t>(stage));
    }
    return absl::OkStatus();
  }
  bool on = false;
  if (!ReadScalar(node, &on))
    return Invalid("recompute: expected true, false or a list of stage indices, got " + Show(node));
  s->set_recompute(on);
  return absl::OkStatus();
}

std::vector<JobKey> MakeTable() {
  std::vector<Row> rows;
  auto add = [&](std::string key, KeyType type, std::string doc) -> Row& {
    rows.emplace_back(std::move(key), type, std::move(doc));
    return rows.back();
  };
  const KeyType kInt = KeyType::kInt, kNumber = KeyType::kNumber, kBool = KeyType::kBool, kName = KeyType::kName,
                kPath = KeyType::kPath, kChoice = KeyType::kChoice, kSection = KeyType::kSection;

  add("name", kName, "a label shown by `list` and `status`").Default("job").Set([](const V& v, S* s) {
    s->set_name(v.text);
  });

  // --- model
  add("model", kSection,
      "`{name: toy | mlp | convnet | resnet50 | gpt, ...}` or just the name; or `{torchscript: PATH}`, or "
      "`{exported: PATH}`")
      .Required()
      .Shorthand("name");
  add("model.name", kChoice, "a model of the zoo (see [Models](#models))")
      .Choices(Names<v1::ModelKind>({{"toy", v1::MODEL_TOY},
                                     {"mlp", v1::MODEL_MLP},
                                     {"convnet", v1::MODEL_CONVNET},
                                     {"resnet50", v1::MODEL_RESNET50},
                                     {"gpt", v1::MODEL_GPT}}))
      .Expect("a name")
      .Set([](const V& v, S* s) { s->mutable_model()->set_kind(static_cast<v1::ModelKind>(v.integer)); });
  add("model.torchscript", kPath,
      "your own model: a TorchScript archive of an `nn.Sequential` (`torch.jit.script(model).save(PATH)`), cut "
      "between its top-level children; its weights are the initial weights. Not with `name`. See "
      "[models.md](models.md)")
      .Set([](const V& v, S* s) {
        s->mutable_model()->set_kind(v1::MODEL_TORCHSCRIPT);
        s->mutable_model()->set_torchscript(v.text);
      });
  add("model.exported", kPath,
      "your own model from PyTorch 2: a program saved by `torch.export.save` (`.pt2`, training IR, from "
      "`torch.export.export(model, args)`), run through LibTorch's operator dispatcher; cut into layers at its "
      "`pipe_split()` marks and before each module of `cut_before`; its weights are the initial weights. Not with "
      "`name` or `torchscript`. See [models.md](models.md)")
      .Set([](const V& v, S* s) {
        s->mutable_model()->set_kind(v1::MODEL_EXPORTED);
        s->mutable_model()->set_exported(v.text);
      });
  add("model.cut_before", kName,
      "exported programs: module paths as the model names them (`fc`, `blocks.3`), separated by commas; a layer "
      "begins at the first operation of each")
      .Set([](const V& v, S* s) { s->mutable_model()->set_cut_before(v.text); });
  auto model_int = [&](const char* key, const char* doc, void (v1::ModelSpec::*set)(int32_t),
                       int32_t (v1::ModelSpec::*get)() const) -> Row& {
    return add(std::string("model.") + key, kInt, doc)
        .Range(1, 1000000)
        .Set([set](const V& v, S* s) { (s->mutable_model()->*set)(static_cast<int32_t>(v.integer)); })
        .Get([get](const S& s) { return static_cast<double>((s.model().*get)()); });
  };
  model_int("num_classes", "width of the last layer", &v1::ModelSpec::set_num_classes, &v1::ModelSpec::num_classes)
      .DefaultDoc("5 (toy), 1000 (resnet50), 10")
      .Only("a zoo model", [](const S& s) { return !ModelFromFile(s.model()); });
  model_int("input_dim", "features per sample", &v1::ModelSpec::set_input_dim, &v1::ModelSpec::input_dim)
      .Range(1, 1e8)
      .DefaultDoc("784")
      .Only("name: mlp", [](const S& s) { return ZooModel(s, v1::MODEL_MLP); });
  add("model.hidden", KeyType::kIntList, "hidden widths (1 to 1000000 each)")
      .DefaultDoc("`[]`")
      .Only("name: mlp", [](const S& s) { return ZooModel(s, v1::MODEL_MLP); })
      .Set([](const V& v, S* s) {
        for (int64_t h : v.integers) s->mutable_model()->add_hidden(static_cast<int32_t>(h));
      });
  model_int("image_size", "inputs are 3 x size x size", &v1::ModelSpec::set_image_size, &v1::ModelSpec::image_size)
      .Range(32, 4096)
      .DefaultDoc("128")
      .Only("name: resnet50", [](const S& s) { return ZooModel(s, v1::MODEL_RESNET50); });
  const auto gpt = [](const S& s) { return ZooModel(s, v1::MODEL_GPT); };
  model_int("vocab", "token ids 0 to vocab - 1", &v1::ModelSpec::set_vocab, &v1::ModelSpec::vocab)
      .Range(1, 1e7)
      .DefaultDoc("32000")
      .Only("name: gpt", gpt);
  model_int("width", "model width (the defaults are W2's 1.34 B decoder)", &v1::ModelSpec::set_width,
            &v1::ModelSpec::width)
      .Range(1, 65536)
      .DefaultDoc("2048")
      .Only("name: gpt", gpt);
  model_int("blocks", "decoder blocks", &v1::ModelSpec::set_blocks, &v1::ModelSpec::blocks)
      .Range(1, 4096)
      .DefaultDoc("24")
      .Only("name: gpt", gpt);
  model_int("heads", "attention heads (they divide `width`)", &v1::ModelSpec::set_heads, &v1::ModelSpec::heads)
      .Range(1, 1024)
      .DefaultDoc("16")
      .Only("name: gpt", gpt);
  model_int("mlp_width", "the MLP's hidden width", &v1::ModelSpec::set_mlp_width, &v1::ModelSpec::mlp_width)
      .Range(1, 1 << 20)
      .DefaultDoc("4 x width")
      .Only("name: gpt", gpt);
  model_int("seq_len", "the longest sequence (learned positions)", &v1::ModelSpec::set_seq_len,
            &v1::ModelSpec::seq_len)
      .Range(1, 1 << 20)
      .DefaultDoc("1024")
      .Only("name: gpt", gpt);
  add("model.fused", kBool,
      "gpt, and exported programs that split attention's heads as `qkv.view(B, T, 3, heads, D).permute(2, 0, 3, 1, "
      "4).unbind(0)`: the gradients of q, k and v written once into the qkv projection's layout by a backward of "
      "Conveyor's own; false: what `qkv.unbind` does (a stack, then a copy). The same arithmetic either way")
      .Default("true")
      .Only("name: gpt or an exported program",
            [gpt](const S& s) { return gpt(s) || s.model().kind() == v1::MODEL_EXPORTED; })
      .Set([](const V& v, S* s) { s->mutable_model()->set_unfused_qkv(!v.flag); });
  add("precision", kChoice,
      "`fp32`; `bf16`: pure bfloat16, parameters, optimizer state and activations (the loss is computed in fp32); "
      "`bf16-mixed`: fp32 parameters and optimizer state (the master weights), forwards in bfloat16 under autocast "
      "as `torch.autocast` runs them, gradients in fp32 (see [Training recipes](#training-recipes)); `fp16-mixed` "
      "(CUDA stages only): the same in float16, with dynamic loss scaling (`loss_scale`)")
      .Choices(Names<v1::Precision>({{"fp32", v1::PRECISION_FP32},
                                     {"bf16", v1::PRECISION_BF16},
                                     {"bf16-mixed", v1::PRECISION_BF16_MIXED},
                                     {"fp16-mixed", v1::PRECISION_FP16_MIXED}}))
      .Expect("fp32, bf16, bf16-mixed or fp16-mixed")
      .Default("fp32")
      .Set([](const V& v, S* s) { s->set_precision(static_cast<v1::Precision>(v.integer)); });

  // --- partition
  add("partition", kSection, "how the model's layers are cut into stages");
  add("partition.stages", kInt,
      "stages, cut into near-equal numbers of layers (resnet50 on 2 stages: the seed's cut between layer2 and layer3)")
      .Default("1")
      .DefaultDoc("1, or one more than the boundaries")
      .Range(1, 4096)
      .Set([](const V& v, S* s) { s->mutable_partition()->set_stages(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.partition().stages(); });
  add("partition.boundaries", KeyType::kIntList,
      "first layer index of stages 2..P (of chunks 2..P·v when interleaved); not with `balance`")
      .Set([](const V& v, S* s) {
        for (int64_t b : v.integers)
          s->mutable_partition()->add_boundaries(static_cast<int32_t>(std::clamp<int64_t>(b, -1, 1 << 30)));
      });
  add("partition.balance", kChoice,
      "without boundaries, how to cut: `layers` (near-equal counts), `params` (near-equal parameter counts) or "
      "`time` (near-equal forward + backward time of one micro-batch, profiled layer by layer on stage 0's device; "
      "the last layer's time includes the loss, which for a language model is as large as the vocabulary); the cut "
      "is the one whose step is shortest when the job's schedule is simulated with these costs (a third forward, "
      "two thirds backward, transfers free; every cut is tried where there are at most 200,000, else coordinate "
      "descent from the cut with the most even chunks). With one chunk per stage that is about the cut with the "
      "cheapest costliest stage; interleaved, the first and last chunks come out lighter, as they lie on the "
      "warm-up's and cool-down's path")
      .Choices(Names<v1::Balance>(
          {{"layers", v1::BALANCE_LAYERS}, {"params", v1::BALANCE_PARAMS}, {"time", v1::BALANCE_TIME}}))
      .Expect("layers, params or time")
      .Default("layers")
      .Set([](const V& v, S* s) { s->mutable_partition()->set_balance(static_cast<v1::Balance>(v.integer)); });

  // --- data
  add("data", kSection,
      "`{name: synthetic | fashion-mnist, ...}` or just the name; or `{format: tensors | tokens, train: FILE, ...}`")
      .DefaultDoc("`synthetic`")
      .Shorthand("name");
  const auto data_kinds = Names<v1::DataKind>({{"synthetic", v1::DATA_SYNTHETIC},
                                               {"fashion-mnist", v1::DATA_FASHION_MNIST},
                                               {"tensors", v1::DATA_TENSORS},
                                               {"tokens", v1::DATA_TOKENS}});
  auto set_kind = [](const V& v, S* s) { s->mutable_data()->set_kind(static_cast<v1::DataKind>(v.integer)); };
  add("data.name", kChoice, "a built-in dataset").Choices(data_kinds).Expect("a name").Set(set_kind);
  auto formats = data_kinds;
  formats.emplace_back("idx", v1::DATA_FASHION_MNIST);
  add("data.format", kChoice,
      "instead of `name`: `tensors` (your files, below), `tokens` (flat binary files of token ids, nanoGPT's and "
      "Megatron's `.bin`, memory-mapped; see [models.md](models.md#token-data)), `idx` (= `fashion-mnist`) or "
      "`synthetic`")
      .Choices(formats)
      .Expect("a data format")
      .Set(set_kind);
  const auto tokens = [](const S& s) { return s.data().kind() == v1::DATA_TOKENS; };
  add("data.train", KeyType::kCustom,
      "tensors and tokens (required): a file written by `torch.save({\"inputs\": X, \"targets\": Y}, FILE)`, first "
      "dimension the sample; inputs floating (converted to float32) or integer, targets int64 classes or floats (see "
      "[models.md](models.md#data-files)); for tokens, the token file. For tensors also several files, one training "
      "split: a glob pattern (`shards/train-*.pt`: the files it matches, in name order) or a list of files (in its "
      "order), each mapped from disk, not read into memory (see [models.md](models.md#shards))")
      .Expect("a path, a glob pattern or a list of paths")
      .Only("format: tensors or tokens", FileData)
      .Read([](const YAML::Node& node, S* s) -> Status {
        std::string path;
        if (ReadScalar(node, &path)) {
          if (path.empty()) return Invalid("data.train: empty path");
          s->mutable_data()->set_train(path);
          return absl::OkStatus();
        }
        if (!node.IsSequence() || node.size() == 0)
          return Invalid("data.train: expected a path, a glob pattern or a list of paths, got " + Show(node));
        // A list: the shards as given; ResolveJobPaths resolves each, `train` stays empty.
        for (std::size_t i = 0; i < node.size(); ++i) {
          if (!ReadScalar(node[i], &path) || path.empty())
            return Invalid("data.train: item " + std::to_string(i) + ": expected a path, got " + Show(node[i]));
          s->mutable_data()->add_train_shards(path);
        }
        return absl::OkStatus();
      });
  add("data.test", kPath, "the test split, in the same format, for `eval`")
      .Only("format: tensors or tokens", FileData)
      .Set([](const V& v, S* s) { s->mutable_data()->set_test(v.text); });
  add("data.shuffle", kBool,
      "each epoch in a permutation drawn from (`seed`, epoch); `false`: in file order, as `DataLoader(shuffle=False)`")
      .DefaultDoc("`true`")
      .Only("format: tensors or tokens", FileData)
      .Set([](const V& v, S* s) { s->mutable_data()->set_no_shuffle(!v.flag); });
  add("data.dtype", kChoice, "tokens (required): the width of the token ids, little-endian")
      .Choices(Names<v1::TokenDType>({{"uint16", v1::TOKEN_DTYPE_UINT16}, {"uint32", v1::TOKEN_DTYPE_UINT32}}))
      .Expect("uint16 or uint32")
      .Only("format: tokens", tokens)
      .Set([](const V& v, S* s) { s->mutable_data()->set_token_dtype(static_cast<v1::TokenDType>(v.integer)); });
  add("data.seq_len", kInt,
      "tokens (required): N, the tokens of one sample; sample i is tokens [iN, iN+N), its target the window one "
      "token later")
      .Range(1, 1 << 24)
      .Only("format: tokens", tokens)
      .Set([](const V& v, S* s) { s->mutable_data()->set_seq_len(v.integer); });
  add("data.path", kPath, "folder of the gzipped IDX files (Debian's `dataset-fashion-mnist`)")
      .DefaultDoc(std::string("`") + kDefaultFashionMnistPath + "`")
      .Only("format: idx (fashion-mnist)", [](const S& s) { return s.data().kind() == v1::DATA_FASHION_MNIST; })
      .Set([](const V& v, S* s) { s->mutable_data()->set_path(v.text); });
  // Fashion-MNIST always trains on its files' 60000 samples and tests on their 10000: a count given for it
  // would be ignored, so it is refused (a subset: data: {format: tensors}).
  const auto synthetic = [](const S& s) { return !FileData(s) && s.data().kind() != v1::DATA_FASHION_MNIST; };
  add("data.train_samples", kInt, "samples per epoch")
      .Default("1024")
      .Range(1, 1e12)
      .Only("name: synthetic", synthetic)
      .Set([](const V& v, S* s) { s->mutable_data()->set_train_samples(v.integer); })
      .Get([](const S& s) { return static_cast<double>(s.data().train_samples()); });
  add("data.test_samples", kInt, "samples in the test split")
      .Default("256")
      .Range(0, 1e12)
      .Only("name: synthetic", synthetic)
      .Set([](const V& v, S* s) { s->mutable_data()->set_test_samples(v.integer); });

  // --- the batch and the schedule
  add("batch_size", kInt, "samples per optimizer step")
      .Default("32")
      .Range(1, 1000000)
      .Set([](const V& v, S* s) { s->set_batch_size(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.batch_size(); });
  add("replicas", kInt,
      "copies of the pipeline trained side by side on R × P stage servers, each on its share of every batch, "
      "their gradients all-reduced before the optimizer step (see [parallelism.md](parallelism.md))")
      .Default("1")
      .Range(1, 4096)
      .Set([](const V& v, S* s) { s->set_replicas(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.replicas(); });
  add("bucket_cap_mb", kNumber,
      "replicas: the gradients are all-reduced in buckets of at most this many MiB, each started as soon as its "
      "gradients are final in the step's last backward pass, as DDP's `bucket_cap_mb` (see "
      "[parallelism.md](parallelism.md))")
      .Default("25")
      .Range(0.001, 1e6)
      .Set([](const V& v, S* s) { s->set_bucket_cap_mb(v.number); })
      .Get([](const S& s) { return BucketCapMb(s); });
  add("zero", kInt,
      "replicas: the ZeRO stage. `1` shards each stage's optimizer state over its R copies, as DeepSpeed's ZeRO-1: "
      "the gradients are reduce-scattered, each copy updates its 1/R slice of every gradient bucket with its share "
      "of the state, and the parameters are all-gathered (the bytes of one all-reduce): the state takes 1/R of the "
      "memory; `0` keeps all of it on every copy. No effect with one replica (see [parallelism.md](parallelism.md))")
      .Default("0")
      .Range(0, 1)
      .Set([](const V& v, S* s) { s->set_zero_stage(static_cast<int32_t>(v.integer)); });
  add("collectives", kChoice,
      "replicas: how the copies of each stage sum their gradients: `auto` (NCCL on the devices where every copy of "
      "the stage is on a GPU of its own in a stage server built with NCCL, else Gloo), `nccl` (a stage whose copies "
      "cannot use NCCL fails the job with FAILED_PRECONDITION naming it) or `gloo` (c10d's Gloo group, through host "
      "memory). `conveyor status --json` names each stage's (see [parallelism.md](parallelism.md))")
      .Choices(Names<v1::CollectiveKind>(
          {{"auto", v1::COLLECTIVES_AUTO}, {"nccl", v1::COLLECTIVES_NCCL}, {"gloo", v1::COLLECTIVES_GLOO}}))
      .Expect("auto, nccl or gloo")
      .Default("auto")
      .Set([](const V& v, S* s) { s->set_collectives(static_cast<v1::CollectiveKind>(v.integer)); });
  add("micro_batches", kInt, "micro-batches per step (near-equal sizes, as `torch.tensor_split`)")
      .DefaultDoc("1")
      .Range(1, 1000000)
      .Set([](const V& v, S* s) { s->set_micro_batches(static_cast<int32_t>(v.integer)); });
  add("split_size", kInt,
      "instead of `micro_batches`: samples per micro-batch, the last one smaller (the seed tutorial's knob)")
      .Range(1, 1000000)
      .Set([](const V& v, S* s) { s->set_split_size(static_cast<int32_t>(v.integer)); });
  add("schedule", kChoice,
      "`gpipe`, `1f1b`, `interleaved` or `zero-bubble` (the fastest on W2 over two GPUs); see [schedules.md](schedules.md)")
      .Choices(Names<v1::ScheduleKind>({{"gpipe", v1::SCHEDULE_GPIPE},
                                        {"1f1b", v1::SCHEDULE_1F1B},
                                        {"interleaved", v1::SCHEDULE_INTERLEAVED},
                                        {"zero-bubble", v1::SCHEDULE_ZERO_BUBBLE}}))
      .Expect("a schedule name")
      .Default("gpipe")
      .Set([](const V& v, S* s) { s->set_schedule(static_cast<v1::ScheduleKind>(v.integer)); });
  add("virtual_stages", kInt, "interleaved: model chunks per stage (2 or more; micro-batches a multiple of the stages)")
      .Default("1")
      .Range(1, 64)
      .Set([](const V& v, S* s) { s->set_virtual_stages(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.virtual_stages(); });
  add("recompute", KeyType::kCustom,
      "`true`, or a list of stage indices: keep only each micro-batch's input and recompute the forward in backward "
      "(the same dropout masks; buffers such as BatchNorm's running statistics are updated by the first forward only)")
      .Expect("true, false or a list of stage indices")
      .DefaultDoc("false")
      .Read(ReadRecompute);

  // --- optimizer and loss
  add("optimizer", kSection, "`{name: sgd | adam | adamw, ...}` or just the name").DefaultDoc("`sgd`").Shorthand("name");
  add("optimizer.name", kChoice,
      "`sgd`, `adam` (L2 weight decay added to the gradient) or `adamw` (decoupled weight decay), each step as "
      "`torch.optim`'s")
      .Choices(Names<v1::OptimizerKind>(
          {{"sgd", v1::OPTIMIZER_SGD}, {"adam", v1::OPTIMIZER_ADAM}, {"adamw", v1::OPTIMIZER_ADAMW}}))
      .Expect("a name")
      .Default("sgd")
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_kind(static_cast<v1::OptimizerKind>(v.integer)); });
  add("optimizer.lr", kNumber, "learning rate")
      .Default("0.01")
      .DefaultDoc("0.01 (sgd), 0.001 (adam, adamw)")
      .Positive(1e3)
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_lr(v.number); })
      .Get([](const S& s) { return s.optimizer().lr(); });
  const auto sgd = [](const S& s) { return s.optimizer().kind() == v1::OPTIMIZER_SGD; };
  const auto adam = [](const S& s) { return s.optimizer().kind() != v1::OPTIMIZER_SGD; };
  add("optimizer.momentum", kNumber, "momentum")
      .Default("0")
      .Range(0, 1)
      .Only("name: sgd", sgd)
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_momentum(v.number); })
      .Get([](const S& s) { return s.optimizer().momentum(); });
  add("optimizer.nesterov", kBool, "Nesterov momentum (with a positive `momentum`)")
      .Default("false")
      .Only("name: sgd", sgd)
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_nesterov(v.flag); });
  add("optimizer.foreach", kBool,
      "each step as a few multi-tensor (`_foreach_*`) kernels over all parameters, as `torch.optim` does on CUDA "
      "by default; false: LibTorch's loop of a few kernels per tensor. The same arithmetic either way (on CUDA "
      "adam's and adamw's within a rounding)")
      .Default("true")
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_per_tensor(!v.flag); });
  add("optimizer.weight_decay", kNumber,
      "sgd, adam: L2 penalty added to the gradient; adamw: decoupled decay (`lr * weight_decay * param`), as "
      "`torch.optim` does")
      .Default("0")
      .DefaultDoc("0; 0.01 (adamw, as torch.optim.AdamW)")
      .Range(0, 1e3)
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_weight_decay(v.number); })
      .Get([](const S& s) { return s.optimizer().weight_decay(); });
  add("optimizer.betas", KeyType::kNumberList, "the moving averages' coefficients, each in [0, 1)")
      .DefaultDoc("`[0.9, 0.999]`")
      .Length(2)
      .Range(0, 1, /*above_lo=*/false, /*below_hi=*/true)
      .Only("name: adam or adamw", adam)
      .Set([](const V& v, S* s) {
        s->mutable_optimizer()->set_beta1(v.numbers[0]);
        s->mutable_optimizer()->set_beta2(v.numbers[1]);
      });
  add("optimizer.eps", kNumber, "added to the denominator")
      .Default("1.0e-8")
      .Positive(1)
      .Only("name: adam or adamw", adam)
      .Set([](const V& v, S* s) { s->mutable_optimizer()->set_eps(v.number); })
      .Get([](const S& s) { return s.optimizer().eps(); });
  add("optimizer.no_decay", KeyType::kCustom,
      "parameter groups: a parameter whose dotted name has one of these as a whole component gets no weight decay "
      "(`bias` matches `3.l.bias`, `norm` matches `2.norm.weight`), as torchtitan and nanoGPT do; each stage logs "
      "its groups when the job starts")
      .Expect("a list of name components")
      .DefaultDoc("`[]`")
      .Read([](const YAML::Node& node, S* s) -> Status {
        if (!node.IsSequence()) return Invalid("optimizer.no_decay: expected a list of names, got " + Show(node));
        for (std::size_t i = 0; i < node.size(); ++i) {
          std::string pattern;
          if (!ReadScalar(node[i], &pattern) || pattern.empty() || pattern.find('.') != std::string::npos)
            return Invalid("optimizer.no_decay: item " + std::to_string(i) +
                           ": expected one component of a parameter name (bias, norm), got " + Show(node[i]));
          s->mutable_optimizer()->add_no_decay(pattern);
        }
        return absl::OkStatus();
      });
  add("lr_schedule", kSection,
      "the learning rate by optimizer step t from 0, with W the warmup and T the job's optimizer steps: "
      "lr·(t+1)/W while t < W; then, with p = (t−W)/(T−W), cosine: min_lr + ½(lr−min_lr)(1 + cos πp), linear: "
      "lr − (lr−min_lr)·p, step: lr·gamma^⌊(t−W)/step_size⌋ (plan/lr_schedule.h); each step's lr is in `status "
      "--json` (`lrs`) and the progress line")
      .DefaultDoc("constant");
  const auto decays = [](std::vector<v1::LrDecay> kinds) {
    return [kinds = std::move(kinds)](const S& s) {
      for (auto k : kinds)
        if (s.lr_schedule().decay() == k) return true;
      return false;
    };
  };
  add("lr_schedule.warmup_steps", kInt, "W: optimizer steps of linear warmup from lr/W to lr")
      .Default("0")
      .Range(0)
      .Set([](const V& v, S* s) { s->mutable_lr_schedule()->set_warmup_steps(v.integer); })
      .Get([](const S& s) { return static_cast<double>(s.lr_schedule().warmup_steps()); });
  add("lr_schedule.decay", kChoice, "after the warmup: `none`, `cosine` or `linear` (to `min_lr`), or `step`")
      .Choices(Names<v1::LrDecay>({{"none", v1::LR_DECAY_NONE},
                                   {"cosine", v1::LR_DECAY_COSINE},
                                   {"linear", v1::LR_DECAY_LINEAR},
                                   {"step", v1::LR_DECAY_STEP}}))
      .Expect("none, cosine, linear or step")
      .Default("none")
      .Set([](const V& v, S* s) { s->mutable_lr_schedule()->set_decay(static_cast<v1::LrDecay>(v.integer)); });
  add("lr_schedule.min_lr", kNumber, "the floor that cosine and linear decay reach at the last step (at most lr)")
      .Default("0")
      .Range(0, 1e3)
      .Only("decay: cosine or linear", decays({v1::LR_DECAY_COSINE, v1::LR_DECAY_LINEAR}))
      .Set([](const V& v, S* s) { s->mutable_lr_schedule()->set_min_lr(v.number); })
      .Get([](const S& s) { return s.lr_schedule().min_lr(); });
  add("lr_schedule.step_size", kInt, "step decay (required with it): optimizer steps between two decays")
      .Range(1, 1e12)
      .Only("decay: step", decays({v1::LR_DECAY_STEP}))
      .Set([](const V& v, S* s) { s->mutable_lr_schedule()->set_step_size(v.integer); });
  add("lr_schedule.gamma", kNumber, "step decay: the factor of each decay")
      .Default("0.1")
      .Range(0, 1, /*above_lo=*/true)
      .Only("decay: step", decays({v1::LR_DECAY_STEP}))
      .Set([](const V& v, S* s) { s->mutable_lr_schedule()->set_gamma(v.number); });
  add("clip_grad_norm", kNumber,
      "the gradients of all stages scaled so that their global L2 norm is at most this, as "
      "`torch.nn.utils.clip_grad_norm_` on the whole model: each stage reports its share of the squared norm, the "
      "coordinator sends every stage the one factor (see [Training recipes](#training-recipes)); each step's norm is "
      "in `status --json` (`grad_norms`); 0: no clipping")
      .Default("0")
      .Range(0, 1e300)
      .Set([](const V& v, S* s) { s->set_clip_grad_norm(v.number); })
      .Get([](const S& s) { return s.clip_grad_norm(); });
  add("accumulate_steps", kInt,
      "K: one optimizer step per K batches, their gradients summed with each batch's loss weighted 1/K (a step "
      "reads K x batch_size samples; `steps` counts optimizer steps)")
      .Default("1")
      .Range(1, 65536)
      .Set([](const V& v, S* s) { s->set_accumulate_steps(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return AccumulateSteps(s); });  // 0 in an older spec: 1
  add("loss_scale", kSection,
      "dynamic loss scaling as `torch.cuda.amp.GradScaler` does it: the loss multiplied by the scale before backward, "
      "the gradients divided by it; a step whose gradients are not finite on any stage is skipped on every stage and "
      "the scale backs off; each step's scale is in `status --json` (`loss_scales`)")
      .DefaultDoc("off; on with `fp16-mixed`");
  const auto scaling = [](const S& s) {
    return s.loss_scale().dynamic() || s.precision() == v1::PRECISION_FP16_MIXED;
  };
  add("loss_scale.dynamic", kBool, "scale the loss (always on with `precision: fp16-mixed`)")
      .DefaultDoc("`false`; `true` with `fp16-mixed`")
      .Set([](const V& v, S* s) { s->mutable_loss_scale()->set_dynamic(v.flag); });
  add("loss_scale.init", kNumber, "the first step's scale")
      .Default("65536")
      .Range(0, 1e38, /*above_lo=*/true)
      .Only("dynamic: true or precision: fp16-mixed", scaling)
      .Set([](const V& v, S* s) { s->mutable_loss_scale()->set_init(v.number); })
      .Get([](const S& s) { return s.loss_scale().init(); });
  add("loss_scale.growth_factor", kNumber, "the scale's factor after `growth_interval` finite steps in a row")
      .Default("2")
      .Range(1, 1e6, /*above_lo=*/true)
      .Only("dynamic: true or precision: fp16-mixed", scaling)
      .Set([](const V& v, S* s) { s->mutable_loss_scale()->set_growth_factor(v.number); })
      .Get([](const S& s) { return s.loss_scale().growth_factor(); });
  add("loss_scale.backoff_factor", kNumber, "the scale's factor after a step with gradients that are not finite")
      .Default("0.5")
      .Range(0, 1, /*above_lo=*/true, /*below_hi=*/true)
      .Only("dynamic: true or precision: fp16-mixed", scaling)
      .Set([](const V& v, S* s) { s->mutable_loss_scale()->set_backoff_factor(v.number); })
      .Get([](const S& s) { return s.loss_scale().backoff_factor(); });
  add("loss_scale.growth_interval", kInt, "finite steps in a row before the scale grows")
      .Default("2000")
      .Range(1, 1e12)
      .Only("dynamic: true or precision: fp16-mixed", scaling)
      .Set([](const V& v, S* s) { s->mutable_loss_scale()->set_growth_interval(v.integer); })
      .Get([](const S& s) { return static_cast<double>(s.loss_scale().growth_interval()); });
  add("inject_inf_gradients", KeyType::kCustom,
      "for tests of loss scaling: a list of `{stage: S, step: N}`; stage S puts an inf into its first gradient at "
      "optimizer step N (from 0), as an fp16 overflow would")
      .Expect("a list of {stage, step}")
      .DefaultDoc("`[]`")
      .Read([](const YAML::Node& node, S* s) -> Status {
        if (!node.IsSequence()) return Invalid("inject_inf_gradients: expected a list of {stage, step}, got " + Show(node));
        for (std::size_t i = 0; i < node.size(); ++i) {
          const YAML::Node& item = node[i];
          int64_t stage = -1, step = -1;
          const bool ok = item.IsMap() && item.size() == 2 && item["stage"] && item["step"] &&
                          ReadScalar(item["stage"], &stage) && ReadScalar(item["step"], &step) && stage >= 0 &&
                          stage < (1 << 20) && step >= 0;
          if (!ok)
            return Invalid("inject_inf_gradients: item " + std::to_string(i) +
                           ": expected {stage: S, step: N} with S and N >= 0, got " + Show(item));
          v1::InfGradient* g = s->add_inject_inf_gradients();
          g->set_stage(static_cast<int32_t>(stage));
          g->set_step(step);
        }
        return absl::OkStatus();
      });
  add("loss", kSection, "a loss name, or `{torchscript: PATH}` for your own")
      .DefaultDoc("`cross_entropy`")
      .Shorthand("name");
  add("loss.name", kChoice,
      "`cross_entropy`, `mse` (against the one-hot of class targets, or against float targets), `nll` "
      "(log-probabilities against classes) or `bce_with_logits` (logits against float targets of the output's shape)")
      .Choices(Names<v1::LossKind>({{"cross_entropy", v1::LOSS_CROSS_ENTROPY},
                                    {"mse", v1::LOSS_MSE},
                                    {"nll", v1::LOSS_NLL},
                                    {"bce_with_logits", v1::LOSS_BCE_WITH_LOGITS}}))
      .Expect("a loss name")
      .Default("cross_entropy")
      .Set([](const V& v, S* s) { s->set_loss(static_cast<v1::LossKind>(v.integer)); });
  add("loss.torchscript", kPath,
      "your own loss: a TorchScript module taking (output, target) and returning the mean over its batch "
      "(`torch.jit.script(module).save(PATH)`), run by the stage that computes the loss; not with `name`. See "
      "[models.md](models.md)")
      .Set([](const V& v, S* s) {
        s->set_loss(v1::LOSS_UNSPECIFIED);
        s->set_loss_torchscript(v.text);
      });

  // --- how long, evaluation, seeds
  add("epochs", kInt, "passes over the training split (the last, incomplete batch of each is dropped) ...")
      .DefaultDoc("1")
      .Range(1, 100000)
      .Set([](const V& v, S* s) { s->set_epochs(static_cast<int32_t>(v.integer)); });
  add("steps", kInt, "... or a number of optimizer steps (not both)")
      .Range(1, 1e9)
      .Set([](const V& v, S* s) { s->set_steps(v.integer); });
  add("eval", kBool,
      "accuracy and mean loss (per token for token data; for gpt models and token data the summary and `--json` add its exp, the perplexity) on the whole test "
      "split: after every epoch for a job given in `epochs` (each epoch's mean loss, time and accuracy are in "
      "`conveyor status`, the summary and `--json`'s `epochs`), at the end for one given in `steps`")
      .Default("false")
      .Set([](const V& v, S* s) { s->set_eval(v.flag); });
  add("eval_batch_size", kInt, "samples per evaluation step")
      .Default("1000")
      .Range(1, 1e9)
      .Set([](const V& v, S* s) { s->set_eval_batch_size(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.eval_batch_size(); });
  add("seed", kInt,
      "weights, synthetic data and the shuffling all derive from it (a TorchScript model's weights come from its "
      "archive)")
      .Default("0")
      .Range(0)
      .Set([](const V& v, S* s) { s->set_seed(static_cast<uint64_t>(v.integer)); });

  // --- weights in and out
  add("init_from", kPath,
      "a state_dict (`torch.save(model.state_dict(), FILE)`) loaded by name before the first step, as "
      "`load_state_dict(strict=True)`: a missing, unexpected or mis-shaped key fails the job with "
      "`INVALID_ARGUMENT` naming the file and the key")
      .Set([](const V& v, S* s) { s->set_init_from(v.text); });
  add("save", kSection, "what is written when the job succeeds");
  add("save.path", kPath,
      "(required in `save`) when the job succeeds, the coordinator gathers every stage's parameters and buffers and "
      "writes them to this file (on its host, under a data root, atomically) as one state_dict that "
      "`torch.load(FILE, weights_only=True)` reads and `load_state_dict(..., strict=True)` takes; `conveyor train "
      "--reference` writes it too. Checked at submission: not a folder, the nearest folder of it that exists writable "
      "(missing ones are made when it is written), and no other queued or running job writing the same file "
      "(`FAILED_PRECONDITION` naming it). A write that fails after training fails the job but leaves the weights on "
      "the stage servers: `conveyor export JOB --out FILE` writes them")
      .Set([](const V& v, S* s) { s->set_save_path(v.text); });
  add("save.format", kChoice,
      "`state_dict`, or `torchscript`: the job's TorchScript archive with the trained weights, loadable by "
      "`torch.jit.load` (built by the first stage, written by the coordinator; a TorchScript model only)")
      .Choices(Names<v1::SaveFormat>({{"state_dict", v1::SAVE_FORMAT_STATE_DICT},
                                      {"torchscript", v1::SAVE_FORMAT_TORCHSCRIPT}}))
      .Expect("state_dict or torchscript")
      .DefaultDoc("`state_dict`")
      .Set([](const V& v, S* s) { s->set_save_format(static_cast<v1::SaveFormat>(v.integer)); });

  // --- devices and links
  add("transport", kChoice,
      "how tensors travel between neighbouring stages: `auto` (NCCL where both ends of a link are CUDA devices of "
      "stage servers built with NCCL, else gRPC), `nccl` (every link; a link that cannot use NCCL fails the job "
      "with FAILED_PRECONDITION naming the link, never a silent fallback) or `grpc` (the chunked gRPC stream). "
      "`conveyor status` and the job summary name what each link used")
      .Choices(Names<v1::TransportKind>(
          {{"auto", v1::TRANSPORT_AUTO}, {"nccl", v1::TRANSPORT_NCCL}, {"grpc", v1::TRANSPORT_GRPC}}))
      .Expect("auto, nccl or grpc")
      .Default("auto")
      .Set([](const V& v, S* s) { s->set_transport(static_cast<v1::TransportKind>(v.integer)); });
  add("nccl_ctas", kInt,
      "thread blocks (so SMs) each NCCL communicator of a link may use, 1 to 64, or `0` for NCCL's own choice. A "
      "receive is posted as soon as its header arrives and waits on the device for its sender, spinning on its SMs "
      "meanwhile: few leave the SMs to the compute (see bench/RESULTS.md for what it costs and saves). With "
      "`cuda_graphs: true`, `0` means 2: NCCL's own count beside graph replays deadlocked W1's link on two H100s")
      .Default(std::to_string(kDefaultNcclCtas))
      .Range(0, 64)
      .Set([](const V& v, S* s) { s->set_nccl_ctas(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.nccl_ctas(); });
  add("nccl_headers", kChoice,
      "where an NCCL link's frame headers travel: `shm`, through a shared memory segment when both stages are on "
      "one host (containers: `ipc: host`), else on the link's gRPC stream; `grpc`, always on the stream. Shared "
      "memory took a 1 MB frame from 221 to 150 us and 64 MB frames from 291 to 322 GB/s on 2 H200s "
      "(bench/RESULTS.md)")
      .Choices(Names<v1::NcclHeaders>({{"shm", v1::NCCL_HEADERS_SHM}, {"grpc", v1::NCCL_HEADERS_GRPC}}))
      .Expect("shm or grpc")
      .Default("shm")
      .Set([](const V& v, S* s) { s->set_nccl_headers(static_cast<v1::NcclHeaders>(v.integer)); });
  add("matmul_sm_carveout", KeyType::kCustom,
      "SMs that matmuls (cuBLAS) leave free for the NCCL kernels running beside them: `off`, `auto` (`nccl_ctas` "
      "for each NCCL communicator of the stage, two per NCCL link) or a number from 1 to 64. A matmul sized for "
      "every SM can wait for the SMs a spinning receive holds. On W2 over 2 H200s `auto` changed nothing measurable "
      "(318.6 against 322.1 ms a step, its GEMMs' total time the same), hence off by default. Needs LibTorch 2.7 or "
      "later (LibTorch warns once that the setting is experimental; an older one logs that it is ignored)")
      .Expect("auto, off or a number of SMs from 1 to 64")
      .DefaultDoc("`off`")
      .Read(ReadCarveout);
  add("cuda_graphs", KeyType::kCustom,
      "CUDA devices record each chunk's forward and backward of each micro-batch as a pair of CUDA graphs during the "
      "second training step (the first runs as it is: kernel choices, lazy initialisation) and replay them from then "
      "on: one launch per pass instead of hundreds. Each pair keeps its own memory (its micro-batch's activations "
      "among it), so a stage holds every micro-batch's activations at once, as GPipe does, whatever the schedule. "
      "Inputs and gradients received are copied into the graphs' own tensors; parameter gradients are zeroed in "
      "place between steps. Training steps of another batch size, and evaluation, run as they are. Ignored on CPU "
      "stages; `true` is refused with `recompute`, mixed precision, loss scaling or the `zero-bubble` schedule "
      "(INVALID_ARGUMENT). `auto` (the default) is on for the zoo's models wherever graphs can work and hold no more "
      "memory than the schedule does: `conveyor train --reference`, one stage, one micro-batch, `gpipe`; off for "
      "`1f1b` and `interleaved` pipelines, replicas of a pipeline of several stages (replicas of one stage replay "
      "theirs and all-reduce the gradients after them), TorchScript models and the "
      "settings `true` refuses, and the job says once "
      "why (the reference's summary, the stage's log). Each stage's `graphed_steps` is in the status and the "
      "summary. On one H100 the Fashion-MNIST ConvNet's reference took 0.4 s an epoch with graphs against 1.4 s "
      "without (bench/RESULTS.md)")
      .Expect("auto, true or false")
      .DefaultDoc("`auto`")
      .Read(ReadCudaGraphs);
  add("steps_in_flight", kInt,
      "training steps the coordinator has sent to the stages at once: with `2` it sends step N+1 as soon as step N, "
      "so that a stage has its next request when a step ends, and a stage server launches N+1 while its device "
      "still works on N (the device does not wait for the host between steps) unless the stage has NCCL links or "
      "replicas that sum through Gloo (NCCL collectives are watched while the step's end is awaited), writes a checkpoint, is profiled, or has not yet recorded its CUDA graphs. Each reply still comes "
      "once the device has finished its step, so every figure and clock is that of finished steps. Steps whose "
      "update the coordinator decides (clipping over several stages, loss scaling) and an evaluation at an "
      "epoch's end run one at a time whatever this says, and so do the first steps under CUDA graphs, until every "
      "stage has recorded its graphs and replayed them once (W1 over an NCCL link hung when a step overlapped the "
      "recording one). `1`: one step at a time, each stage waiting for its device "
      "before it replies (W1 on one stage server on an H200: 15.7 ms a step with `2`, the reference's; see "
      "bench/RESULTS.md)")
      .Default("2")
      .Range(1, 2)
      .Set([](const V& v, S* s) { s->set_steps_in_flight(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return StepsInFlight(s); });
  add("memory_format", kChoice,
      "how 4-D tensors are laid out: `channels_last` converts the convolution weights once when a stage places them, "
      "the model's input once as it is loaded, and keeps activations and their gradients channels-last across "
      "stages (the frames say so; nothing is converted back and forth), as PyTorch's "
      "`model.to(memory_format=torch.channels_last)` does; `contiguous` keeps NCHW; `auto` is `channels_last` on "
      "CUDA devices for the zoo's convolutional models (resnet50, convnet: cuDNN's NHWC kernels and Tensor Cores) "
      "and `contiguous` elsewhere (LibTorch's CPU convolutions gain nothing). The arithmetic is the same up to "
      "float rounding")
      .Choices(Names<v1::MemoryFormat>({{"auto", v1::MEMORY_FORMAT_AUTO},
                                        {"contiguous", v1::MEMORY_FORMAT_CONTIGUOUS},
                                        {"channels_last", v1::MEMORY_FORMAT_CHANNELS_LAST}}))
      .Expect("auto, contiguous or channels_last")
      .Default("auto")
      .Set([](const V& v, S* s) { s->set_memory_format(static_cast<v1::MemoryFormat>(v.integer)); });
  add("cudnn_benchmark", kBool,
      "CUDA stages (and `conveyor train --reference` on CUDA) let cuDNN time its algorithms for each convolution "
      "shape on first use and keep the fastest (`torch.backends.cudnn.benchmark`). The first step of each micro-batch "
      "size is slower; later ones use the chosen kernels, whose rounding may differ from the default ones. Ignored "
      "on the CPU")
      .Default("true")
      .Set([](const V& v, S* s) { s->set_cudnn_benchmark(v.flag); });
  add("profile_step", kInt,
      "a training step (1-based) that every stage, and `conveyor train --reference`, runs under LibTorch's operator "
      "profiler, writing a Chrome trace (`<job>-step<N>-stage<K>.json`) to the stage server's `--profile-dir` "
      "(default its `--checkpoint-dir`; `conveyor local --profile-dir`, default the current folder). "
      "`bench/profile_summary.py A.json [B.json]` tabulates the costliest kernels and compares two runs, e.g. "
      "against `bench/torch_pipelining.py --profile-dir`")
      .DefaultDoc("none")
      .Range(0, 1e12)
      .Set([](const V& v, S* s) { s->set_profile_step(v.integer); })
      .Get([](const S& s) { return static_cast<double>(s.profile_step()); });

  // --- failures and checkpoints
  add("stage_timeout", kNumber,
      "seconds a stage waits for a neighbour's tensor (or a stage's first answer) before the step fails with a "
      "message that names the action and the peer. A CUDA stage's first training step of a job waits at least 300 "
      "s: on a freshly started GPU host it may load CUDA's libraries and let cuDNN time every convolution")
      .Default("10")
      .Positive(1e7)
      .Expect("a number of seconds")
      .Set([](const V& v, S* s) { s->set_stage_timeout_s(v.number); })
      .Get([](const S& s) { return s.stage_timeout_s(); });
  add("checkpoint_every", kInt,
      "every K steps, and after the last one, each stage writes its parameters, buffers, optimizer state and RNG to "
      "its `--checkpoint-dir` (see [recovery.md](recovery.md)); 0: never. A stage server of replica 0 started "
      "without `--checkpoint-dir` refuses such a job when it is placed (FAILED_PRECONDITION naming the stage), "
      "before any training")
      .Default("0")
      .Range(0, 1e12)
      .Expect("a number of steps")
      .Set([](const V& v, S* s) { s->set_checkpoint_every(v.integer); })
      .Get([](const S& s) { return static_cast<double>(s.checkpoint_every()); });
  add("keep_checkpoints", kInt, "checkpoint files each stage keeps per job (the newest; at least 2)")
      .Default("3")
      .Range(2, 1000)
      .Set([](const V& v, S* s) { s->set_keep_checkpoints(static_cast<int32_t>(v.integer)); })
      .Get([](const S& s) { return s.keep_checkpoints(); });
  add("recovery_timeout", kNumber,
      "seconds to wait for a failed stage to answer again before the job fails naming it; 0: fail at the first "
      "stage failure. `conveyor submit --wait` waits as long for a coordinator it lost (a restarted coordinator "
      "resumes its jobs) before it gives up")
      .Default(std::to_string(static_cast<int>(kDefaultRecoveryTimeoutS)))
      .Range(0, 1e7)
      .Expect("a number of seconds")
      .Set([](const V& v, S* s) { s->set_recovery_timeout_s(v.number); })
      .Get([](const S& s) { return s.recovery_timeout_s(); });

  add("on_lost_server", kChoice,
      "what the job does when a stage server does not answer for `lost_after` seconds (lost for good: a host gone, "
      "its disk with it): `replan` goes on over the servers left, the lost stage's layers folded onto its "
      "neighbours (a stage server then holds several stages' layers, computing what they computed), from the newest "
      "checkpoint complete on every stage, read from the copies the other servers keep (`checkpoint_copies`); "
      "`fail` fails the job naming the server (see [recovery.md](recovery.md), \"A server lost for good\"). Of two "
      "replicas, the one that lost a server is dropped and the other takes the global batch. Jobs with more replicas, "
      "zero 1 or the interleaved schedule fail either way")
      .Choices(Names<v1::LostServerAction>({{"replan", v1::LOST_SERVER_REPLAN}, {"fail", v1::LOST_SERVER_FAIL}}))
      .Expect("replan or fail")
      .Default("replan")
      .Set([](const V& v, S* s) { s->set_on_lost_server(static_cast<v1::LostServerAction>(v.integer)); });
  add("lost_after", kNumber,
      "seconds a failed stage server may take to answer again before it counts as lost for good (`on_lost_server`); "
      "0: at once, at the first failure (a server that restarts in a second is then lost too). At most "
      "`recovery_timeout`")
      .DefaultDoc("recovery_timeout")
      .Range(0, 1e7)
      .Expect("a number of seconds")
      .Set([](const V& v, S* s) { s->set_lost_after_s(v.number); });
  add("checkpoint_copies", kInt,
      "copies of each checkpoint kept by another stage server of the job (the next one in the job's list), so that "
      "losing a server and its disk loses no checkpoint; each stage sends its file there after writing it (stage to "
      "stage, never through the coordinator), and that server needs a `--checkpoint-dir`. 0: none")
      .Default("1")
      .Range(0, 1)
      .Set([](const V& v, S* s) { s->set_checkpoint_copies(static_cast<int32_t>(v.integer)); });

  std::vector<JobKey> table;
  table.reserve(rows.size());
  for (Row& r : rows) table.push_back(r.Take());
  return table;
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
