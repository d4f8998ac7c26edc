#include "plan/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <regex>
#include <type_traits>
#include <fstream>
#include <set>
#include <sstream>

#include "plan/model_catalog.h"

namespace conveyor {
namespace {

Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

// A scalar's type under YAML 1.2's core schema, the one typing rule of job
// files: a quoted scalar is a string; a plain one is null, a bool (true,
// false), an integer (decimal, 0o octal, 0x hex), a float, or else a string.
// yaml-cpp itself would read "1", yes and on as numbers and bools.
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

// Reads a scalar of the type `out` has, by the core schema; false when the
// scalar is of another type or out of range.
bool ReadScalar(const YAML::Node& node, std::string* out) {
  if (Resolve(node) != Scalar::kString) return false;
  *out = node.Scalar();
  return true;
}

bool ReadScalar(const YAML::Node& node, bool* out) {
  if (Resolve(node) != Scalar::kBool) return false;
  *out = node.Scalar()[0] == 't' || node.Scalar()[0] == 'T';
  return true;
}

bool ReadScalar(const YAML::Node& node, double* out) {
  const Scalar kind = Resolve(node);
  if (kind != Scalar::kInt && kind != Scalar::kFloat) return false;
  std::string v = node.Scalar();
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

template <typename Int>
bool ReadScalar(const YAML::Node& node, Int* out) {
  static_assert(std::is_integral_v<Int>);
  if (Resolve(node) != Scalar::kInt) return false;
  const std::string& v = node.Scalar();
  errno = 0;
  char* end = nullptr;
  long double value = 0;
  if (v.size() > 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'o')) {
    value = static_cast<long double>(std::strtoull(v.c_str() + 2, &end, v[1] == 'x' ? 16 : 8));
  } else {
    value = static_cast<long double>(std::strtoll(v.c_str(), &end, 10));
  }
  if (errno == ERANGE || value < static_cast<long double>(std::numeric_limits<Int>::min()) ||
      value > static_cast<long double>(std::numeric_limits<Int>::max()))
    return false;
  *out = static_cast<Int>(value);
  return true;
}

// One YAML mapping being read: every key taken is remembered, and Finish()
// reports the first key nobody asked for.
class Fields {
 public:
  Fields(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {}

  Status CheckIsMap() const {
    if (node_.IsMap()) return absl::OkStatus();
    return Invalid(Where("") + "expected a mapping, got " + Show(node_));
  }

  // Each getter leaves *out untouched when the key is absent.
  template <typename T>
  Status Get(const char* key, T* out, const char* what, bool* present = nullptr) {
    YAML::Node value = Take(key);
    if (present) *present = value.IsDefined() && !value.IsNull();
    if (!value.IsDefined() || value.IsNull()) return absl::OkStatus();
    if (!value.IsScalar() || !ReadScalar(value, out))
      return Invalid(Where(key) + "expected " + what + ", got " + Show(value));
    return absl::OkStatus();
  }

  Status GetIntList(const char* key, std::vector<int64_t>* out, bool* present) {
    YAML::Node value = Take(key);
    *present = value.IsDefined() && !value.IsNull();
    if (!*present) return absl::OkStatus();
    if (!value.IsSequence()) return Invalid(Where(key) + "expected a list of integers, got " + Show(value));
    for (std::size_t i = 0; i < value.size(); ++i) {
      int64_t item = 0;
      if (!value[i].IsScalar() || !ReadScalar(value[i], &item))
        return Invalid(Where(key) + "item " + std::to_string(i) + ": expected an integer, got " + Show(value[i]));
      out->push_back(item);
    }
    return absl::OkStatus();
  }

  YAML::Node Child(const char* key) { return Take(key); }

  Status Finish() const {
    for (const auto& kv : node_) {
      std::string key = kv.first.as<std::string>();
      if (!used_.count(key)) return Invalid(Where(key) + "unknown key");
    }
    return absl::OkStatus();
  }

  std::string Where(const std::string& key) const {
    std::string full = path_.empty() ? key : (key.empty() ? path_ : path_ + "." + key);
    return full.empty() ? "job: " : full + ": ";
  }
  const std::string& path() const { return path_; }

 private:
  YAML::Node Take(const char* key) {
    used_.insert(key);
    return node_[key];
  }

  YAML::Node node_;
  std::string path_;
  std::set<std::string> used_;
};

template <typename Enum>
Status ParseName(const Fields& f, const char* key, const std::string& name,
                 const std::vector<std::pair<std::string, Enum>>& names, Enum* out) {
  std::string choices;
  for (const auto& [n, e] : names) {
    if (n == name) {
      *out = e;
      return absl::OkStatus();
    }
    choices += (choices.empty() ? "" : ", ") + n;
  }
  return Invalid(f.Where(key) + "unknown value '" + name + "' (one of: " + choices + ")");
}

const std::vector<std::pair<std::string, v1::ModelKind>> kModels = {
    {"toy", v1::MODEL_TOY},           {"mlp", v1::MODEL_MLP}, {"convnet", v1::MODEL_CONVNET},
    {"resnet50", v1::MODEL_RESNET50}, {"gpt", v1::MODEL_GPT}};
const std::vector<std::pair<std::string, v1::TransportKind>> kTransports = {
    {"auto", v1::TRANSPORT_AUTO}, {"nccl", v1::TRANSPORT_NCCL}, {"grpc", v1::TRANSPORT_GRPC}};

const std::vector<std::pair<std::string, v1::Precision>> kPrecisions = {
    {"fp32", v1::PRECISION_FP32}, {"bf16", v1::PRECISION_BF16}};
const std::vector<std::pair<std::string, v1::DataKind>> kData = {
    {"synthetic", v1::DATA_SYNTHETIC}, {"fashion-mnist", v1::DATA_FASHION_MNIST}, {"tensors", v1::DATA_TENSORS},
    {"tokens", v1::DATA_TOKENS}};
const std::vector<std::pair<std::string, v1::TokenDType>> kTokenDTypes = {{"uint16", v1::TOKEN_DTYPE_UINT16},
                                                                          {"uint32", v1::TOKEN_DTYPE_UINT32}};
const std::vector<std::pair<std::string, v1::NcclHeaders>> kNcclHeaders = {
    {"shm", v1::NCCL_HEADERS_SHM}, {"grpc", v1::NCCL_HEADERS_GRPC}};
const std::vector<std::pair<std::string, v1::ScheduleKind>> kSchedules = {
    {"gpipe", v1::SCHEDULE_GPIPE},
    {"1f1b", v1::SCHEDULE_1F1B},
    {"interleaved", v1::SCHEDULE_INTERLEAVED},
    {"zero-bubble", v1::SCHEDULE_ZERO_BUBBLE}};
const std::vector<std::pair<std::string, v1::OptimizerKind>> kOptimizers = {
    {"sgd", v1::OPTIMIZER_SGD}, {"adam", v1::OPTIMIZER_ADAM}};
const std::vector<std::pair<std::string, v1::LossKind>> kLosses = {
    {"cross_entropy", v1::LOSS_CROSS_ENTROPY},
    {"mse", v1::LOSS_MSE},
    {"nll", v1::LOSS_NLL},
    {"bce_with_logits", v1::LOSS_BCE_WITH_LOGITS}};

// `model: convnet` is short for `model: {name: convnet}`; same for data.
Status ReadNamedSection(Fields& parent, const char* key, Fields** section,
                        std::unique_ptr<Fields>* storage, std::string* name) {
  YAML::Node node = parent.Child(key);
  if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
  if (node.IsScalar()) {
    if (!ReadScalar(node, name)) return Invalid(std::string(key) + ": expected a name or a mapping, got " + Show(node));
    return absl::OkStatus();
  }
  *storage = std::make_unique<Fields>(node, key);
  CONVEYOR_RETURN_IF_ERROR((*storage)->CheckIsMap());
  CONVEYOR_RETURN_IF_ERROR((*storage)->Get("name", name, "a name"));
  *section = storage->get();
  return absl::OkStatus();
}

Status ReadModel(Fields& root, v1::ModelSpec* model) {
  Fields* f = nullptr;
  std::unique_ptr<Fields> storage;
  std::string name;
  CONVEYOR_RETURN_IF_ERROR(ReadNamedSection(root, "model", &f, &storage, &name));
  // The user's own model: a TorchScript archive of an nn.Sequential.
  std::string script;
  bool has_script = false;
  if (f) CONVEYOR_RETURN_IF_ERROR(f->Get("torchscript", &script, "a path", &has_script));
  if (has_script) {
    if (!name.empty()) return Invalid("model: give name (a zoo model) or torchscript (your model), not both");
    if (script.empty()) return Invalid("model.torchscript: empty path");
    model->set_kind(v1::MODEL_TORCHSCRIPT);
    model->set_torchscript(script);
    return f->Finish();
  }
  if (name.empty()) return Invalid("model: missing (e.g. model: {name: convnet} or model: {torchscript: model.pt})");
  v1::ModelKind kind;
  Fields named(YAML::Node(), "model");
  CONVEYOR_RETURN_IF_ERROR(ParseName(f ? *f : named, "name", name, kModels, &kind));
  model->set_kind(kind);
  if (!f) return absl::OkStatus();
  int32_t v = 0;
  bool present = false;
  CONVEYOR_RETURN_IF_ERROR(f->Get("num_classes", &v, "an integer", &present));
  if (present) model->set_num_classes(v);
  CONVEYOR_RETURN_IF_ERROR(f->Get("input_dim", &v, "an integer", &present));
  if (present) model->set_input_dim(v);
  std::vector<int64_t> hidden;
  CONVEYOR_RETURN_IF_ERROR(f->GetIntList("hidden", &hidden, &present));
  for (int64_t h : hidden) model->add_hidden(static_cast<int32_t>(h));
  const std::pair<const char*, void (v1::ModelSpec::*)(int32_t)> sizes[] = {
      {"image_size", &v1::ModelSpec::set_image_size}, {"vocab", &v1::ModelSpec::set_vocab},
      {"width", &v1::ModelSpec::set_width},           {"blocks", &v1::ModelSpec::set_blocks},
      {"heads", &v1::ModelSpec::set_heads},           {"mlp_width", &v1::ModelSpec::set_mlp_width},
      {"seq_len", &v1::ModelSpec::set_seq_len}};
  for (const auto& [key, setter] : sizes) {
    CONVEYOR_RETURN_IF_ERROR(f->Get(key, &v, "an integer", &present));
    if (present) (model->*setter)(v);
  }
  return f->Finish();
}

// The zoo's default sizes: W1's ResNet50 images, W2's GPT (1.34 B parameters).
void FillModelDefaults(v1::ModelSpec* m) {
  if (m->kind() == v1::MODEL_RESNET50) {
    if (m->image_size() == 0) m->set_image_size(128);
    if (m->num_classes() == 0) m->set_num_classes(1000);
  }
  if (m->kind() == v1::MODEL_GPT) {
    if (m->vocab() == 0) m->set_vocab(32000);
    if (m->width() == 0) m->set_width(2048);
    if (m->blocks() == 0) m->set_blocks(24);
    if (m->heads() == 0) m->set_heads(16);
    if (m->mlp_width() == 0) m->set_mlp_width(4 * m->width());
    if (m->seq_len() == 0) m->set_seq_len(1024);
  }
}

Status ReadData(Fields& root, v1::DataSpec* data) {
  Fields* f = nullptr;
  std::unique_ptr<Fields> storage;
  std::string name;
  CONVEYOR_RETURN_IF_ERROR(ReadNamedSection(root, "data", &f, &storage, &name));
  // format: idx | tensors | synthetic, the same as name: (fashion-mnist is idx).
  std::string format;
  bool has_format = false;
  if (f) CONVEYOR_RETURN_IF_ERROR(f->Get("format", &format, "a data format", &has_format));
  if (has_format) {
    if (!name.empty()) return Invalid("data: give name or format, not both");
    name = format == "idx" ? "fashion-mnist" : format;
  }
  if (name.empty()) name = "synthetic";
  v1::DataKind kind;
  Fields named(YAML::Node(), "data");
  CONVEYOR_RETURN_IF_ERROR(ParseName(f ? *f : named, "name", name, kData, &kind));
  data->set_kind(kind);
  if (kind == v1::DATA_FASHION_MNIST) data->set_path(kDefaultFashionMnistPath);
  data->set_train_samples(1024);
  data->set_test_samples(256);
  if (!f) return absl::OkStatus();
  std::string path;
  bool present = false;
  bool shuffle = true;
  if (kind == v1::DATA_TENSORS || kind == v1::DATA_TOKENS) {
    const bool tokens = kind == v1::DATA_TOKENS;
    CONVEYOR_RETURN_IF_ERROR(f->Get("train", &path, "a path", &present));
    if (!present || path.empty())
      return Invalid(tokens ? "data.train: missing (the file of training token ids)"
                            : "data.train: missing (the file of training inputs and targets)");
    if (tokens) {
      std::string dtype;
      CONVEYOR_RETURN_IF_ERROR(f->Get("dtype", &dtype, "uint16 or uint32", &present));
      if (!present) return Invalid("data.dtype: missing (the width of the file's token ids: uint16 or uint32)");
      v1::TokenDType token_dtype;
      CONVEYOR_RETURN_IF_ERROR(ParseName(*f, "dtype", dtype, kTokenDTypes, &token_dtype));
      data->set_token_dtype(token_dtype);
      int64_t seq_len = 0;
      CONVEYOR_RETURN_IF_ERROR(f->Get("seq_len", &seq_len, "an integer", &present));
      if (!present) return Invalid("data.seq_len: missing (the tokens in one sample)");
      data->set_seq_len(seq_len);
    }
    data->set_train(path);
    CONVEYOR_RETURN_IF_ERROR(f->Get("test", &path, "a path", &present));
    if (present) data->set_test(path);
    CONVEYOR_RETURN_IF_ERROR(f->Get("shuffle", &shuffle, "true or false"));
    data->set_no_shuffle(!shuffle);
    return f->Finish();
  }
  CONVEYOR_RETURN_IF_ERROR(f->Get("path", &path, "a path", &present));
  if (present) data->set_path(path);
  int64_t n = 0;
  CONVEYOR_RETURN_IF_ERROR(f->Get("train_samples", &n, "an integer", &present));
  if (present) data->set_train_samples(n);
  CONVEYOR_RETURN_IF_ERROR(f->Get("test_samples", &n, "an integer", &present));
  if (present) data->set_test_samples(n);
  return f->Finish();
}

Status ReadPartition(Fields& root, v1::PartitionSpec* part) {
  YAML::Node node = root.Child("partition");
  part->set_stages(1);
  part->set_balance(v1::BALANCE_LAYERS);
  if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
  Fields f(node, "partition");
  CONVEYOR_RETURN_IF_ERROR(f.CheckIsMap());
  int32_t stages = 0;
  bool has_stages = false, has_bounds = false;
  CONVEYOR_RETURN_IF_ERROR(f.Get("stages", &stages, "an integer", &has_stages));
  std::vector<int64_t> bounds;
  CONVEYOR_RETURN_IF_ERROR(f.GetIntList("boundaries", &bounds, &has_bounds));
  std::string balance = "layers";
  bool has_balance = false;
  CONVEYOR_RETURN_IF_ERROR(f.Get("balance", &balance, "layers, params or time", &has_balance));
  static const std::vector<std::pair<std::string, v1::Balance>> kBalances = {
      {"layers", v1::BALANCE_LAYERS}, {"params", v1::BALANCE_PARAMS}, {"time", v1::BALANCE_TIME}};
  v1::Balance b;
  CONVEYOR_RETURN_IF_ERROR(ParseName(f, "balance", balance, kBalances, &b));
  part->set_balance(b);
  if (has_balance && has_bounds) return Invalid("partition: give boundaries or balance, not both");
  CONVEYOR_RETURN_IF_ERROR(f.Finish());
  for (int64_t b : bounds) part->add_boundaries(static_cast<int32_t>(b));
  // With boundaries alone, one chunk per stage; with virtual_stages the
  // stages must be given too (PartitionLayers checks the counts agree).
  if (has_stages) {
    part->set_stages(stages);
  } else if (has_bounds) {
    part->set_stages(static_cast<int32_t>(bounds.size()) + 1);
  }
  return absl::OkStatus();
}

Status ReadOptimizer(Fields& root, v1::OptimizerSpec* opt) {
  Fields* f = nullptr;
  std::unique_ptr<Fields> storage;
  std::string name = "sgd";
  CONVEYOR_RETURN_IF_ERROR(ReadNamedSection(root, "optimizer", &f, &storage, &name));
  v1::OptimizerKind kind;
  Fields named(YAML::Node(), "optimizer");
  CONVEYOR_RETURN_IF_ERROR(ParseName(f ? *f : named, "name", name, kOptimizers, &kind));
  opt->set_kind(kind);
  opt->set_lr(kind == v1::OPTIMIZER_ADAM ? 1e-3 : 0.01);
  opt->set_beta1(0.9);
  opt->set_beta2(0.999);
  opt->set_eps(1e-8);
  if (!f) return absl::OkStatus();
  double v = 0;
  bool present = false;
  CONVEYOR_RETURN_IF_ERROR(f->Get("lr", &v, "a number", &present));
  if (present) opt->set_lr(v);
  CONVEYOR_RETURN_IF_ERROR(f->Get("weight_decay", &v, "a number", &present));
  if (present) opt->set_weight_decay(v);
  if (kind == v1::OPTIMIZER_SGD) {
    CONVEYOR_RETURN_IF_ERROR(f->Get("momentum", &v, "a number", &present));
    if (present) opt->set_momentum(v);
  } else {
    CONVEYOR_RETURN_IF_ERROR(f->Get("eps", &v, "a number", &present));
    if (present) opt->set_eps(v);
    YAML::Node betas = f->Child("betas");
    if (betas.IsDefined() && !betas.IsNull()) {
      double b[2] = {0, 0};
      if (!betas.IsSequence() || betas.size() != 2)
        return Invalid("optimizer.betas: expected a list of two numbers, got " + Show(betas));
      for (int i = 0; i < 2; ++i) {
        if (!betas[i].IsScalar() || !ReadScalar(betas[i], &b[i]))
          return Invalid("optimizer.betas: item " + std::to_string(i) + ": expected a number, got " + Show(betas[i]));
      }
      opt->set_beta1(b[0]);
      opt->set_beta2(b[1]);
    }
  }
  return f->Finish();
}

Status ReadRoot(const YAML::Node& node, v1::JobSpec* spec) {
  Fields f(node, "");
  if (!node.IsDefined() || node.IsNull()) return Invalid("the job file is empty (it needs at least model: NAME)");
  if (!node.IsMap()) return Invalid("job file: expected a mapping of keys, got " + Show(node));
  std::string name = "job";
  CONVEYOR_RETURN_IF_ERROR(f.Get("name", &name, "a name"));
  spec->set_name(name);
  CONVEYOR_RETURN_IF_ERROR(ReadModel(f, spec->mutable_model()));
  FillModelDefaults(spec->mutable_model());
  CONVEYOR_RETURN_IF_ERROR(ReadPartition(f, spec->mutable_partition()));
  CONVEYOR_RETURN_IF_ERROR(ReadData(f, spec->mutable_data()));

  int32_t i32 = 0;
  bool present = false, has_mb = false, has_split = false;
  spec->set_batch_size(32);
  CONVEYOR_RETURN_IF_ERROR(f.Get("batch_size", &i32, "an integer", &present));
  if (present) spec->set_batch_size(i32);
  CONVEYOR_RETURN_IF_ERROR(f.Get("micro_batches", &i32, "an integer", &has_mb));
  if (has_mb) spec->set_micro_batches(i32);
  CONVEYOR_RETURN_IF_ERROR(f.Get("split_size", &i32, "an integer", &has_split));
  if (has_split) spec->set_split_size(i32);
  if (has_mb && has_split)
    return Invalid("micro_batches and split_size: give one or the other, not both");
  if (!has_mb && !has_split) spec->set_micro_batches(1);

  std::string word = "gpipe";
  CONVEYOR_RETURN_IF_ERROR(f.Get("schedule", &word, "a schedule name"));
  v1::ScheduleKind schedule;
  CONVEYOR_RETURN_IF_ERROR(ParseName(f, "schedule", word, kSchedules, &schedule));
  spec->set_schedule(schedule);

  CONVEYOR_RETURN_IF_ERROR(ReadOptimizer(f, spec->mutable_optimizer()));

  // loss: NAME, or {torchscript: PATH} (a module of (output, target)).
  YAML::Node loss_node = f.Child("loss");
  if (loss_node.IsDefined() && loss_node.IsMap()) {
    Fields lf(loss_node, "loss");
    std::string path;
    bool present = false;
    CONVEYOR_RETURN_IF_ERROR(lf.Get("torchscript", &path, "a path", &present));
    CONVEYOR_RETURN_IF_ERROR(lf.Finish());  // a misspelt key is named before the missing one
    if (!present || path.empty())
      return Invalid("loss.torchscript: missing (a TorchScript module of (output, target) returning the batch's mean)");
    spec->set_loss_torchscript(path);
  } else {
    word = "cross_entropy";
    CONVEYOR_RETURN_IF_ERROR(f.Get("loss", &word, "a loss name or {torchscript: PATH}"));
    v1::LossKind loss;
    CONVEYOR_RETURN_IF_ERROR(ParseName(f, "loss", word, kLosses, &loss));
    spec->set_loss(loss);
  }

  bool has_epochs = false, has_steps = false;
  int64_t i64 = 0;
  CONVEYOR_RETURN_IF_ERROR(f.Get("epochs", &i32, "an integer", &has_epochs));
  if (has_epochs) spec->set_epochs(i32);
  CONVEYOR_RETURN_IF_ERROR(f.Get("steps", &i64, "an integer", &has_steps));
  if (has_steps) spec->set_steps(i64);
  if (has_epochs && has_steps) return Invalid("epochs and steps: give one or the other, not both");
  if (!has_epochs && !has_steps) spec->set_epochs(1);

  bool eval = false;
  CONVEYOR_RETURN_IF_ERROR(f.Get("eval", &eval, "true or false"));
  spec->set_eval(eval);
  uint64_t seed = 0;
  CONVEYOR_RETURN_IF_ERROR(f.Get("seed", &seed, "a non-negative integer"));
  spec->set_seed(seed);
  double timeout = 10.0;
  CONVEYOR_RETURN_IF_ERROR(f.Get("stage_timeout", &timeout, "a number of seconds"));
  spec->set_stage_timeout_s(timeout);
  int64_t every = 0;
  CONVEYOR_RETURN_IF_ERROR(f.Get("checkpoint_every", &every, "a number of steps"));
  spec->set_checkpoint_every(every);
  double recovery = 120.0;
  CONVEYOR_RETURN_IF_ERROR(f.Get("recovery_timeout", &recovery, "a number of seconds"));
  spec->set_recovery_timeout_s(recovery);
  spec->set_keep_checkpoints(3);
  CONVEYOR_RETURN_IF_ERROR(f.Get("keep_checkpoints", &i32, "an integer", &present));
  if (present) spec->set_keep_checkpoints(i32);
  spec->set_eval_batch_size(1000);
  CONVEYOR_RETURN_IF_ERROR(f.Get("eval_batch_size", &i32, "an integer", &present));
  if (present) spec->set_eval_batch_size(i32);
  word = "fp32";
  CONVEYOR_RETURN_IF_ERROR(f.Get("precision", &word, "fp32 or bf16"));
  v1::Precision precision;
  CONVEYOR_RETURN_IF_ERROR(ParseName(f, "precision", word, kPrecisions, &precision));
  spec->set_precision(precision);
  word = "auto";
  CONVEYOR_RETURN_IF_ERROR(f.Get("transport", &word, "auto, nccl or grpc"));
  v1::TransportKind transport;
  CONVEYOR_RETURN_IF_ERROR(ParseName(f, "transport", word, kTransports, &transport));
  spec->set_transport(transport);
  spec->set_nccl_ctas(kDefaultNcclCtas);
  CONVEYOR_RETURN_IF_ERROR(f.Get("nccl_ctas", &i32, "an integer", &present));
  if (present) spec->set_nccl_ctas(i32);
  // matmul_sm_carveout: auto | off | a number of SMs
  YAML::Node carveout = f.Child("matmul_sm_carveout");
  if (carveout.IsDefined() && !carveout.IsNull()) {
    int32_t sms = 0;
    word.clear();
    const bool number = carveout.IsScalar() && ReadScalar(carveout, &sms);
    if (!number && carveout.IsScalar()) ReadScalar(carveout, &word);
    if (word == "auto") {
      spec->set_matmul_sm_carveout(v1::SM_CARVEOUT_AUTO);
    } else if (word != "off") {
      if (!number || sms < 1 || sms > 64)
        return Invalid("matmul_sm_carveout: expected auto, off or a number of SMs from 1 to 64, got " + Show(carveout));
      spec->set_matmul_sm_carveout(v1::SM_CARVEOUT_FIXED);
      spec->set_matmul_sm_carveout_sms(sms);
    }
  }
  bool graphs = false;
  CONVEYOR_RETURN_IF_ERROR(f.Get("cuda_graphs", &graphs, "true or false"));
  spec->set_cuda_graphs(graphs);
  std::string headers = "shm";
  CONVEYOR_RETURN_IF_ERROR(f.Get("nccl_headers", &headers, "shm or grpc"));
  v1::NcclHeaders header_path;
  CONVEYOR_RETURN_IF_ERROR(ParseName(f, "nccl_headers", headers, kNcclHeaders, &header_path));
  spec->set_nccl_headers(header_path);
  CONVEYOR_RETURN_IF_ERROR(f.Get("profile_step", &i64, "an integer", &present));
  if (present) spec->set_profile_step(i64);
  spec->set_virtual_stages(1);
  CONVEYOR_RETURN_IF_ERROR(f.Get("virtual_stages", &i32, "an integer", &present));
  if (present) spec->set_virtual_stages(i32);
  std::string path;
  CONVEYOR_RETURN_IF_ERROR(f.Get("init_from", &path, "a path", &present));
  if (present) spec->set_init_from(path);
  YAML::Node save = f.Child("save");
  if (save.IsDefined() && !save.IsNull()) {
    Fields sf(save, "save");
    CONVEYOR_RETURN_IF_ERROR(sf.CheckIsMap());
    CONVEYOR_RETURN_IF_ERROR(sf.Get("path", &path, "a path", &present));
    if (!present || path.empty()) return Invalid("save.path: missing (where the trained weights go)");
    spec->set_save_path(path);
    std::string format = "state_dict";
    CONVEYOR_RETURN_IF_ERROR(sf.Get("format", &format, "state_dict or torchscript"));
    if (format != "state_dict" && format != "torchscript")
      return Invalid("save.format: unknown value '" + format + "' (one of: state_dict, torchscript)");
    spec->set_save_format(format == "torchscript" ? v1::SAVE_FORMAT_TORCHSCRIPT : v1::SAVE_FORMAT_STATE_DICT);
    CONVEYOR_RETURN_IF_ERROR(sf.Finish());
  }
  // recompute: true | false | [stage, ...]
  YAML::Node recompute = f.Child("recompute");
  if (recompute.IsDefined() && !recompute.IsNull()) {
    if (recompute.IsSequence()) {
      for (std::size_t i = 0; i < recompute.size(); ++i) {
        int32_t stage = 0;
        if (!recompute[i].IsScalar() || !ReadScalar(recompute[i], &stage))
          return Invalid("recompute: item " + std::to_string(i) + ": expected a stage index, got " + Show(recompute[i]));
        spec->add_recompute_stages(stage);
      }
    } else {
      bool on = false;
      if (!recompute.IsScalar() || !ReadScalar(recompute, &on))
        return Invalid("recompute: expected true, false or a list of stage indices, got " + Show(recompute));
      spec->set_recompute(on);
    }
  }
  return f.Finish();
}

// The offset of the first byte that is not part of valid UTF-8 (or is NUL),
// or npos.
std::size_t FirstNonText(const std::string& s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int more = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
    if (c == 0 || more < 0 || i + static_cast<std::size_t>(more) >= s.size() + (more == 0 ? 1 : 0)) return i;
    for (int k = 1; k <= more; ++k)
      if ((static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]) >> 6) != 0x2) return i;
    i += static_cast<std::size_t>(more) + 1;
  }
  return std::string::npos;
}

}  // namespace

StatusOr<v1::JobSpec> ParseJobYaml(const std::string& yaml_text) {
  if (yaml_text.size() > kMaxJobFileBytes)
    return Invalid("the job file is larger than " + std::to_string(kMaxJobFileBytes >> 20) + " MiB");
  if (const std::size_t at = FirstNonText(yaml_text); at != std::string::npos) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(yaml_text[at]));
    return Invalid("the job file is not text (YAML): byte " + std::to_string(at) + " (" + byte +
                   ") is not UTF-8");
  }
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return Invalid("job file is not valid YAML: line " + std::to_string(e.mark.line + 1) +
                   ", column " + std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  v1::JobSpec spec;
  try {
    CONVEYOR_RETURN_IF_ERROR(ReadRoot(root, &spec));
  } catch (const YAML::Exception& e) {  // e.g. a non-scalar key
    return Invalid(std::string("job file: ") + e.what());
  }
  CONVEYOR_RETURN_IF_ERROR(ValidateJobSpec(spec));
  return spec;
}

StatusOr<std::string> ReadJobFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const std::string why = std::strerror(errno);
    if (errno == ENOENT) return absl::NotFoundError("job file " + path + " does not exist");
    return absl::PermissionDeniedError("cannot read job file " + path + ": " + why);
  }
  if (S_ISDIR(st.st_mode)) return Invalid(path + " is a folder, not a job file");
  if (!S_ISREG(st.st_mode)) return Invalid(path + " is not a regular file");
  if (st.st_size > static_cast<off_t>(kMaxJobFileBytes))
    return Invalid("job file " + path + " is larger than " + std::to_string(kMaxJobFileBytes >> 20) + " MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError("cannot read job file " + path + ": " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

StatusOr<v1::JobSpec> LoadJobFile(const std::string& path) {
  CONVEYOR_ASSIGN_OR_RETURN(std::string text, ReadJobFile(path));
  auto spec = ParseJobYaml(text);
  if (!spec.ok()) return Annotate(spec.status(), path);
  return spec;
}

int TokenWidth(v1::TokenDType dtype) {
  switch (dtype) {
    case v1::TOKEN_DTYPE_UINT16: return 2;
    case v1::TOKEN_DTYPE_UINT32: return 4;
    default: return 0;
  }
}

StatusOr<int64_t> TokenSamples(const v1::DataSpec& data, const std::string& key, const std::string& path,
                               int64_t bytes) {
  const int width = TokenWidth(data.token_dtype());
  if (width == 0) return Invalid("data.dtype: missing (uint16 or uint32)");
  if (data.seq_len() <= 0) return Invalid("data.seq_len: must be positive");
  const std::string name = width == 2 ? "uint16" : "uint32";
  if (bytes % width != 0) {
    return Invalid(key + ": " + path + " is " + std::to_string(bytes) + " bytes, not a whole number of " + name +
                   " token ids (" + std::to_string(width) + " bytes each): is data.dtype right?");
  }
  const int64_t tokens = bytes / width;
  return tokens > 0 ? (tokens - 1) / data.seq_len() : 0;
}

Status CheckJobFiles(const v1::JobSpec& spec) {
  if (spec.data().kind() == v1::DATA_TOKENS) {
    for (const auto& [key, path] : {std::pair<std::string, std::string>{"data.train", spec.data().train()},
                                    std::pair<std::string, std::string>{"data.test", spec.data().test()}}) {
      if (path.empty()) continue;
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) return absl::NotFoundError(key + ": " + path + " does not exist");
      if (!S_ISREG(st.st_mode)) return Invalid(key + ": " + path + " is not a regular file");
      CONVEYOR_RETURN_IF_ERROR(TokenSamples(spec.data(), key, path, static_cast<int64_t>(st.st_size)).status());
    }
  }
  if (spec.data().kind() == v1::DATA_FASHION_MNIST) {
    const std::string& dir = spec.data().path();
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return absl::NotFoundError("data.path: " + dir +
                                 " is not a folder here (Fashion-MNIST: install Debian's dataset-fashion-mnist)");
    for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                             "t10k-labels-idx1-ubyte.gz"}) {
      const std::string file = dir + "/" + name;
      if (::stat(file.c_str(), &st) != 0)
        return absl::NotFoundError("data.path: " + dir + " has no " + name + " (a Fashion-MNIST folder holds four)");
    }
  }
  return absl::OkStatus();
}

namespace {

// `path` with `..` and symbolic links resolved; a file that does not exist
// yet keeps its name under its resolved folder. "" when the folder is missing.
std::string RealPath(const std::string& path, bool* exists) {
  char buf[PATH_MAX];
  *exists = ::realpath(path.c_str(), buf) != nullptr;
  if (*exists) return buf;
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::realpath(dir.c_str(), buf) == nullptr) return "";
  return std::string(buf) + "/" + path.substr(slash == std::string::npos ? 0 : slash + 1);
}

bool Under(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

}  // namespace

Status ResolveJobPaths(v1::JobSpec* spec, const std::vector<std::string>& roots) {
  std::vector<std::string> real_roots;
  for (const auto& r : roots) {
    bool exists = false;
    std::string real = RealPath(r, &exists);
    if (exists) real_roots.push_back(real);
  }
  std::string listed;
  for (const auto& r : roots) listed += (listed.empty() ? "" : ", ") + r;
  auto resolve = [&](const char* key, std::string* path, bool must_exist) -> Status {
    if (path->empty()) return absl::OkStatus();
    std::string joined = *path;
    if (joined[0] != '/' && !roots.empty()) joined = roots.front() + "/" + joined;
    bool exists = false;
    const std::string real = RealPath(joined, &exists);
    if (real.empty() || (must_exist && !exists))
      return absl::NotFoundError(std::string(key) + ": " + joined + " does not exist");
    if (!roots.empty()) {
      bool inside = false;
      for (const auto& r : real_roots) inside |= Under(real, r);
      if (!inside) {
        return absl::PermissionDeniedError(std::string(key) + ": " + *path + " (" + real +
                                           ") is outside the data roots (" + listed +
                                           "); a server reads and writes only under its --data-root folders");
      }
    }
    *path = real;
    return absl::OkStatus();
  };
  std::string p = spec->model().torchscript();
  CONVEYOR_RETURN_IF_ERROR(resolve("model.torchscript", &p, true));
  spec->mutable_model()->set_torchscript(p);
  p = spec->data().path();
  if (spec->data().kind() == v1::DATA_FASHION_MNIST) {
    CONVEYOR_RETURN_IF_ERROR(resolve("data.path", &p, true));
    spec->mutable_data()->set_path(p);
  }
  p = spec->data().train();
  CONVEYOR_RETURN_IF_ERROR(resolve("data.train", &p, true));
  spec->mutable_data()->set_train(p);
  p = spec->data().test();
  CONVEYOR_RETURN_IF_ERROR(resolve("data.test", &p, true));
  spec->mutable_data()->set_test(p);
  p = spec->loss_torchscript();
  CONVEYOR_RETURN_IF_ERROR(resolve("loss.torchscript", &p, true));
  spec->set_loss_torchscript(p);
  p = spec->init_from();
  CONVEYOR_RETURN_IF_ERROR(resolve("init_from", &p, true));
  spec->set_init_from(p);
  p = spec->save_path();
  CONVEYOR_RETURN_IF_ERROR(resolve("save.path", &p, false));
  spec->set_save_path(p);
  return CheckJobFiles(*spec);
}

void ApplyDescription(const v1::DescribeReply& r, v1::JobSpec* spec) {
  if (spec->model().kind() == v1::MODEL_TORCHSCRIPT) {
    v1::ModelSpec* m = spec->mutable_model();
    m->set_num_layers(r.num_layers());
    *m->mutable_layer_names() = r.layer_names();
    *m->mutable_layer_parameters() = r.layer_parameters();
  }
  if (spec->data().kind() == v1::DATA_TENSORS || spec->data().kind() == v1::DATA_TOKENS) {
    v1::DataSpec* d = spec->mutable_data();
    *d->mutable_input_sample_shape() = r.input_sample_shape();
    d->set_input_dtype(r.input_dtype());
    *d->mutable_target_sample_shape() = r.target_sample_shape();
    d->set_target_dtype(r.target_dtype());
  }
}

std::vector<std::string> DefaultDataRoots() {
  char cwd[PATH_MAX];
  std::vector<std::string> roots;
  if (::getcwd(cwd, sizeof cwd) != nullptr) roots.push_back(cwd);
  roots.push_back(kDatasetsRoot);
  return roots;
}

Status ValidateJobSpec(const v1::JobSpec& spec) {
  const auto& m = spec.model();
  if (m.kind() == v1::MODEL_UNSPECIFIED) return Invalid("model.name: missing");
  if (m.num_classes() < 0 || m.num_classes() > 1000000)
    return Invalid("model.num_classes: must be between 1 and 1000000, got " +
                   std::to_string(m.num_classes()));
  if (m.kind() == v1::MODEL_TOY && m.num_classes() != 0 && m.num_classes() != 5)
    return Invalid("model.num_classes: the toy model has 5 outputs");
  const bool gpt = m.kind() == v1::MODEL_GPT;
  const bool script = m.kind() == v1::MODEL_TORCHSCRIPT;
  if (script && m.torchscript().empty()) return Invalid("model.torchscript: missing");
  if (!script && !m.torchscript().empty()) return Invalid("model.torchscript: for a TorchScript model only");
  if (!gpt && (m.vocab() || m.width() || m.blocks() || m.heads() || m.mlp_width() || m.seq_len()))
    return Invalid("model: vocab, width, blocks, heads, mlp_width and seq_len are for the gpt model only");
  if (m.kind() != v1::MODEL_RESNET50 && m.image_size() != 0)
    return Invalid("model.image_size: for the resnet50 model only");
  if (gpt) {
    const int64_t caps[][2] = {{m.vocab(), 10000000}, {m.width(), 65536}, {m.blocks(), 4096},
                               {m.heads(), 1024},     {m.mlp_width(), 1 << 20}, {m.seq_len(), 1 << 20}};
    for (const auto& c : caps)
      if (c[0] <= 0 || c[0] > c[1]) return Invalid("model: gpt sizes must be positive (and sane)");
    if (m.width() % m.heads() != 0)
      return Invalid("model.heads: " + std::to_string(m.heads()) + " does not divide width " + std::to_string(m.width()));
  }
  if (m.kind() == v1::MODEL_RESNET50 && (m.image_size() < 32 || m.image_size() > 4096))
    return Invalid("model.image_size: must be between 32 and 4096");
  if (m.kind() == v1::MODEL_MLP) {
    if (m.input_dim() < 0 || m.input_dim() > 100000000)
      return Invalid("model.input_dim: must be positive");
    for (int h : m.hidden())
      if (h <= 0 || h > 1000000) return Invalid("model.hidden: widths must be positive, got " + std::to_string(h));
  } else if (m.input_dim() != 0 || m.hidden_size() != 0) {
    return Invalid("model: input_dim and hidden are for the mlp model only");
  }
  if (spec.loss() == v1::LOSS_MSE && gpt) return Invalid("loss: mse is not for the gpt model (its targets are tokens)");
  const auto& d = spec.data();
  if (d.kind() == v1::DATA_UNSPECIFIED) return Invalid("data.name: missing");
  if (d.kind() == v1::DATA_SYNTHETIC && (d.train_samples() <= 0 || d.test_samples() < 0))
    return Invalid("data.train_samples: must be positive");
  if (spec.precision() == v1::PRECISION_UNSPECIFIED) return Invalid("precision: missing");
  if (d.kind() == v1::DATA_FASHION_MNIST) {
    if (d.path().empty()) return Invalid("data.path: missing");
    bool image_model = script || m.kind() == v1::MODEL_CONVNET ||
                       (m.kind() == v1::MODEL_MLP && (m.input_dim() == 0 || m.input_dim() == 784));
    if (!image_model)
      return Invalid("data: fashion-mnist gives 1x28x28 images; use convnet or mlp (input_dim 784)");
    if (m.num_classes() != 0 && m.num_classes() != 10)
      return Invalid("model.num_classes: fashion-mnist has 10 classes");
  }
  if (spec.batch_size() <= 0 || spec.batch_size() > 1000000)
    return Invalid("batch_size: must be between 1 and 1000000, got " + std::to_string(spec.batch_size()));
  if (spec.micro_batches() != 0 && spec.split_size() != 0)
    return Invalid("micro_batches and split_size: give one or the other, not both");
  if (spec.micro_batches() == 0 && spec.split_size() == 0)
    return Invalid("micro_batches: missing");
  if (spec.micro_batches() < 0 || spec.split_size() < 0)
    return Invalid("micro_batches/split_size: must be positive");
  if (spec.micro_batches() > spec.batch_size())
    return Invalid("micro_batches: " + std::to_string(spec.micro_batches()) +
                   " is larger than batch_size " + std::to_string(spec.batch_size()));
  if (spec.split_size() > spec.batch_size())
    return Invalid("split_size: " + std::to_string(spec.split_size()) +
                   " is larger than batch_size " + std::to_string(spec.batch_size()));
  if (spec.schedule() == v1::SCHEDULE_UNSPECIFIED) return Invalid("schedule: missing");
  const auto& o = spec.optimizer();
  if (o.kind() == v1::OPTIMIZER_UNSPECIFIED) return Invalid("optimizer.name: missing");
  if (!(o.lr() > 0) || o.lr() > 1e3) return Invalid("optimizer.lr: must be positive");
  if (o.momentum() < 0 || o.weight_decay() < 0)
    return Invalid("optimizer: momentum and weight_decay must not be negative");
  if (o.kind() == v1::OPTIMIZER_ADAM &&
      (o.beta1() < 0 || o.beta1() >= 1 || o.beta2() < 0 || o.beta2() >= 1 || !(o.eps() > 0)))
    return Invalid("optimizer: adam needs 0 <= betas < 1 and eps > 0");
  if (spec.loss() == v1::LOSS_UNSPECIFIED && spec.loss_torchscript().empty()) return Invalid("loss: missing");
  if (spec.epochs() < 0 || spec.steps() < 0 || (spec.epochs() == 0 && spec.steps() == 0))
    return Invalid("epochs/steps: must be positive");
  if (spec.epochs() > 100000 || spec.steps() > 1000000000) return Invalid("epochs/steps: too large");
  if (!(spec.stage_timeout_s() > 0)) return Invalid("stage_timeout: must be a positive number of seconds");
  if (spec.eval_batch_size() <= 0) return Invalid("eval_batch_size: must be positive");
  if (spec.checkpoint_every() < 0) return Invalid("checkpoint_every: must be 0 (never) or a positive number of steps");
  if (!(spec.recovery_timeout_s() >= 0)) return Invalid("recovery_timeout: must be 0 or a positive number of seconds");
  if (spec.nccl_ctas() < 0 || spec.nccl_ctas() > 64)
    return Invalid("nccl_ctas: must be between 0 (NCCL's default) and 64, got " + std::to_string(spec.nccl_ctas()));
  if (spec.matmul_sm_carveout() == v1::SM_CARVEOUT_FIXED &&
      (spec.matmul_sm_carveout_sms() < 1 || spec.matmul_sm_carveout_sms() > 64))
    return Invalid("matmul_sm_carveout: must be off, auto or 1 to 64 SMs");
  if (spec.profile_step() < 0) return Invalid("profile_step: must be 0 (none) or a training step, from 1");
  if (spec.steps() > 0 && spec.profile_step() > spec.steps())
    return Invalid("profile_step: " + std::to_string(spec.profile_step()) + " is past the job's last step (" +
                   std::to_string(spec.steps()) + ")");
  if (spec.keep_checkpoints() < 2 || spec.keep_checkpoints() > 1000)
    return Invalid("keep_checkpoints: must be between 2 and 1000, got " + std::to_string(spec.keep_checkpoints()));
  if (spec.virtual_stages() < 1 || spec.virtual_stages() > 64)
    return Invalid("virtual_stages: must be between 1 and 64, got " + std::to_string(spec.virtual_stages()));
  if (spec.schedule() == v1::SCHEDULE_INTERLEAVED) {
    if (spec.virtual_stages() < 2) return Invalid("virtual_stages: the interleaved schedule needs 2 or more");
    const int64_t m = static_cast<int64_t>(MicroBatchSizes(spec, spec.batch_size()).size());
    if (m % spec.partition().stages() != 0) {
      return Invalid("micro_batches: the interleaved schedule needs a multiple of the stages (" +
                     std::to_string(spec.partition().stages()) + "), got " + std::to_string(m));
    }
  } else if (spec.virtual_stages() != 1) {
    return Invalid("virtual_stages: only the interleaved schedule hosts several chunks per stage");
  }
  if (spec.cuda_graphs() && (spec.recompute() || spec.recompute_stages_size() > 0))
    return Invalid("cuda_graphs: cannot be combined with recompute (a graph replays the forward that backward reads)");
  if (spec.cuda_graphs() && spec.schedule() == v1::SCHEDULE_ZERO_BUBBLE)
    return Invalid("cuda_graphs: cannot be combined with the zero-bubble schedule (its backward is split in two passes)");
  for (int s : spec.recompute_stages())
    if (s < 0 || s >= spec.partition().stages())
      return Invalid("recompute: stage " + std::to_string(s) + " is not one of the job's stages");
  if (spec.partition().stages() <= 0)
    return Invalid("partition.stages: must be at least 1, got " + std::to_string(spec.partition().stages()));
  if ((d.kind() == v1::DATA_TENSORS || d.kind() == v1::DATA_TOKENS) && d.train().empty())
    return Invalid("data.train: missing");
  if (d.kind() == v1::DATA_TOKENS) {
    if (TokenWidth(d.token_dtype()) == 0) return Invalid("data.dtype: missing (uint16 or uint32)");
    if (d.seq_len() <= 0 || d.seq_len() > (1 << 24))
      return Invalid("data.seq_len: must be between 1 and " + std::to_string(1 << 24) + ", got " +
                     std::to_string(d.seq_len()));
    if (!script && !gpt)
      return Invalid("data: tokens give int64 token ids [batch, seq_len]; use the gpt model or a TorchScript one");
    if (gpt && d.seq_len() > m.seq_len())
      return Invalid("data.seq_len: " + std::to_string(d.seq_len()) + " is longer than model.seq_len " +
                     std::to_string(m.seq_len()));
  } else if (d.token_dtype() != v1::TOKEN_DTYPE_UNSPECIFIED || d.seq_len() != 0) {
    return Invalid("data: dtype and seq_len are for format: tokens only");
  }
  if (spec.save_format() != v1::SAVE_FORMAT_UNSPECIFIED && spec.save_path().empty()) return Invalid("save.path: missing");
  if (spec.save_format() == v1::SAVE_FORMAT_TORCHSCRIPT && !script)
    return Invalid("save.format: torchscript needs a model from a TorchScript archive (model: {torchscript: PATH}); "
                   "the zoo's " + ModelName(m.kind()) + " saves as state_dict only");
  if (script && spec.precision() != v1::PRECISION_FP32 && spec.precision() != v1::PRECISION_BF16)
    return Invalid("precision: unknown");
  // A TorchScript model's layers are counted when the job is placed (stage 0
  // reads the archive); a zoo model's are known now.
  if (script && m.num_layers() == 0) {
    int64_t last = 0;
    for (int b : spec.partition().boundaries()) {
      if (b <= last) return Invalid("partition.boundaries: must be increasing and positive");
      last = b;
    }
    return absl::OkStatus();
  }
  return PartitionLayers(spec).status();
}

std::string ScheduleName(v1::ScheduleKind kind) {
  if (kind == v1::SCHEDULE_REFERENCE) return "reference";
  for (const auto& [n, k] : kSchedules)
    if (k == kind) return n;
  return "unspecified";
}

std::string LinkName(v1::LinkKind kind) {
  switch (kind) {
    case v1::LINK_IN_PROCESS: return "inproc";
    case v1::LINK_GRPC: return "grpc";
    case v1::LINK_NCCL: return "nccl";
    default: return "";
  }
}

std::string ModelName(v1::ModelKind kind) {
  if (kind == v1::MODEL_TORCHSCRIPT) return "torchscript";
  for (const auto& [n, k] : kModels)
    if (k == kind) return n;
  return "unspecified";
}

std::string JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_QUEUED: return "queued";
    case v1::JOB_STATE_RUNNING: return "running";
    case v1::JOB_STATE_SUCCEEDED: return "succeeded";
    case v1::JOB_STATE_FAILED: return "failed";
    case v1::JOB_STATE_CANCELLED: return "cancelled";
    case v1::JOB_STATE_RECOVERING: return "recovering";
    default: return "unknown";
  }
}

v1::EpochReport EpochSummary(const google::protobuf::RepeatedField<float>& losses, int64_t done,
                             int64_t steps_per_epoch, int64_t timed_steps, int64_t batch_size, double seconds) {
  v1::EpochReport e;
  e.set_epoch(static_cast<int>(done / steps_per_epoch));
  double sum = 0;
  int64_t n = 0;
  for (int64_t s = done - steps_per_epoch; s < done && s < losses.size(); ++s, ++n) sum += losses.Get(static_cast<int>(s));
  e.set_mean_loss(n > 0 ? static_cast<float>(sum / static_cast<double>(n)) : 0.0f);
  e.set_train_seconds(seconds);
  e.set_samples_per_second(seconds > 0 ? static_cast<double>(timed_steps * batch_size) / seconds : 0);
  return e;
}

double TheoreticalIdleFraction(const v1::JobSpec& spec) {
  const double p = spec.partition().stages();
  const double m = static_cast<double>(MicroBatchSizes(spec, spec.batch_size()).size());
  const double v = std::max(1, spec.virtual_stages());
  switch (spec.schedule()) {
    case v1::SCHEDULE_INTERLEAVED: return (p - 1) / (v * m + p - 1);
    case v1::SCHEDULE_ZERO_BUBBLE: return (p - 1) / (m + p - 1) / 3;
    default: return (p - 1) / (m + p - 1);
  }
}

bool RecomputeOn(const v1::JobSpec& spec, int stage) {
  if (spec.recompute()) return true;
  for (int s : spec.recompute_stages())
    if (s == stage) return true;
  return false;
}

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

std::vector<int64_t> MicroBatchSizes(const v1::JobSpec& spec, int64_t batch) {
  std::vector<int64_t> sizes;
  if (batch <= 0) return sizes;
  if (spec.split_size() > 0) {
    for (int64_t start = 0; start < batch; start += spec.split_size())
      sizes.push_back(std::min<int64_t>(spec.split_size(), batch - start));
    return sizes;
  }
  int64_t m = std::min<int64_t>(std::max(spec.micro_batches(), 1), batch);
  for (int64_t i = 0; i < m; ++i) sizes.push_back(batch / m + (i < batch % m ? 1 : 0));
  return sizes;
}

}  // namespace conveyor
