#include "common/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "common/model_catalog.h"

namespace conveyor {
namespace {

Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

std::string Show(const YAML::Node& node) {
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";
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
    if (!value.IsScalar()) return Invalid(Where(key) + "expected " + what + ", got " + Show(value));
    try {
      *out = value.as<T>();
    } catch (const YAML::Exception&) {
      return Invalid(Where(key) + "expected " + what + ", got " + Show(value));
    }
    return absl::OkStatus();
  }

  Status GetIntList(const char* key, std::vector<int64_t>* out, bool* present) {
    YAML::Node value = Take(key);
    *present = value.IsDefined() && !value.IsNull();
    if (!*present) return absl::OkStatus();
    if (!value.IsSequence()) return Invalid(Where(key) + "expected a list of integers, got " + Show(value));
    for (std::size_t i = 0; i < value.size(); ++i) {
      try {
        out->push_back(value[i].as<int64_t>());
      } catch (const YAML::Exception&) {
        return Invalid(Where(key) + "item " + std::to_string(i) +
                       ": expected an integer, got " + Show(value[i]));
      }
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
    {"synthetic", v1::DATA_SYNTHETIC}, {"fashion-mnist", v1::DATA_FASHION_MNIST}};
const std::vector<std::pair<std::string, v1::ScheduleKind>> kSchedules = {
    {"gpipe", v1::SCHEDULE_GPIPE},
    {"1f1b", v1::SCHEDULE_1F1B},
    {"interleaved", v1::SCHEDULE_INTERLEAVED},
    {"zero-bubble", v1::SCHEDULE_ZERO_BUBBLE}};
const std::vector<std::pair<std::string, v1::OptimizerKind>> kOptimizers = {
    {"sgd", v1::OPTIMIZER_SGD}, {"adam", v1::OPTIMIZER_ADAM}};
const std::vector<std::pair<std::string, v1::LossKind>> kLosses = {
    {"cross_entropy", v1::LOSS_CROSS_ENTROPY}, {"mse", v1::LOSS_MSE}};

// `model: convnet` is short for `model: {name: convnet}`; same for data.
Status ReadNamedSection(Fields& parent, const char* key, Fields** section,
                        std::unique_ptr<Fields>* storage, std::string* name) {
  YAML::Node node = parent.Child(key);
  if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
  if (node.IsScalar()) {
    *name = node.Scalar();
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
  if (name.empty()) return Invalid("model: missing (e.g. model: {name: convnet})");
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
  std::string name = "synthetic";
  CONVEYOR_RETURN_IF_ERROR(ReadNamedSection(root, "data", &f, &storage, &name));
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
      if (!betas.IsSequence() || betas.size() != 2)
        return Invalid("optimizer.betas: expected a list of two numbers, got " + Show(betas));
      try {
        opt->set_beta1(betas[0].as<double>());
        opt->set_beta2(betas[1].as<double>());
      } catch (const YAML::Exception&) {
        return Invalid("optimizer.betas: expected a list of two numbers");
      }
    }
  }
  return f->Finish();
}

Status ReadRoot(const YAML::Node& node, v1::JobSpec* spec) {
  Fields f(node, "");
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

  word = "cross_entropy";
  CONVEYOR_RETURN_IF_ERROR(f.Get("loss", &word, "a loss name"));
  v1::LossKind loss;
  CONVEYOR_RETURN_IF_ERROR(ParseName(f, "loss", word, kLosses, &loss));
  spec->set_loss(loss);

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
  word = "off";
  CONVEYOR_RETURN_IF_ERROR(f.Get("matmul_sm_carveout", &word, "auto, off or a number of SMs"));
  if (word == "auto") {
    spec->set_matmul_sm_carveout(-1);
  } else if (word != "off") {
    char* end = nullptr;
    const long sms = std::strtol(word.c_str(), &end, 10);
    if (word.empty() || *end != '\0' || sms < 1 || sms > 64)
      return Invalid("matmul_sm_carveout: expected auto, off or a number of SMs from 1 to 64, got '" + word + "'");
    spec->set_matmul_sm_carveout(static_cast<int32_t>(sms));
  }
  bool graphs = false;
  CONVEYOR_RETURN_IF_ERROR(f.Get("cuda_graphs", &graphs, "true or false"));
  spec->set_cuda_graphs(graphs);
  std::string headers = "shm";
  CONVEYOR_RETURN_IF_ERROR(f.Get("nccl_headers", &headers, "shm or grpc"));
  if (headers != "shm" && headers != "grpc")
    return Invalid("nccl_headers: expected shm or grpc, got '" + headers + "'");
  spec->set_nccl_headers_on_grpc(headers == "grpc");
  CONVEYOR_RETURN_IF_ERROR(f.Get("profile_step", &i64, "an integer", &present));
  if (present) spec->set_profile_step(i64);
  spec->set_virtual_stages(1);
  CONVEYOR_RETURN_IF_ERROR(f.Get("virtual_stages", &i32, "an integer", &present));
  if (present) spec->set_virtual_stages(i32);
  // recompute: true | false | [stage, ...]
  YAML::Node recompute = f.Child("recompute");
  if (recompute.IsDefined() && !recompute.IsNull()) {
    if (recompute.IsSequence()) {
      for (std::size_t i = 0; i < recompute.size(); ++i) {
        try {
          spec->add_recompute_stages(recompute[i].as<int32_t>());
        } catch (const YAML::Exception&) {
          return Invalid("recompute: item " + std::to_string(i) + ": expected a stage index, got " + Show(recompute[i]));
        }
      }
    } else {
      try {
        spec->set_recompute(recompute.as<bool>());
      } catch (const YAML::Exception&) {
        return Invalid("recompute: expected true, false or a list of stage indices, got " + Show(recompute));
      }
    }
  }
  return f.Finish();
}

}  // namespace

StatusOr<v1::JobSpec> ParseJobYaml(const std::string& yaml_text) {
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

StatusOr<v1::JobSpec> LoadJobFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read job file " + path);
  std::stringstream text;
  text << in.rdbuf();
  auto spec = ParseJobYaml(text.str());
  if (!spec.ok()) return Annotate(spec.status(), path);
  return spec;
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
    bool image_model = m.kind() == v1::MODEL_CONVNET ||
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
  if (spec.loss() == v1::LOSS_UNSPECIFIED) return Invalid("loss: missing");
  if (spec.epochs() < 0 || spec.steps() < 0 || (spec.epochs() == 0 && spec.steps() == 0))
    return Invalid("epochs/steps: must be positive");
  if (spec.epochs() > 100000 || spec.steps() > 1000000000) return Invalid("epochs/steps: too large");
  if (!(spec.stage_timeout_s() > 0)) return Invalid("stage_timeout: must be a positive number of seconds");
  if (spec.eval_batch_size() <= 0) return Invalid("eval_batch_size: must be positive");
  if (spec.checkpoint_every() < 0) return Invalid("checkpoint_every: must be 0 (never) or a positive number of steps");
  if (!(spec.recovery_timeout_s() >= 0)) return Invalid("recovery_timeout: must be 0 or a positive number of seconds");
  if (spec.nccl_ctas() < 0 || spec.nccl_ctas() > 64)
    return Invalid("nccl_ctas: must be between 0 (NCCL's default) and 64, got " + std::to_string(spec.nccl_ctas()));
  if (spec.matmul_sm_carveout() < -1 || spec.matmul_sm_carveout() > 64)
    return Invalid("matmul_sm_carveout: must be 0 (off), -1 (auto) or 1 to 64 SMs");
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
  return PartitionLayers(spec).status();
}

std::string ScheduleName(v1::ScheduleKind kind) {
  for (const auto& [n, k] : kSchedules)
    if (k == kind) return n;
  return "unspecified";
}

std::string ModelName(v1::ModelKind kind) {
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
