#include "plan/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <glob.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
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

#include "plan/job_keys.h"
#include "plan/model_catalog.h"
#include "plan/schedule.h"

namespace conveyor {
namespace {

Status Invalid(const std::string& msg) { return absl::InvalidArgumentError(msg); }

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

// After the table's keys are read (job_keys.h): the defaults that depend on
// other keys, and the rules of which keys go together.
Status Complete(const std::set<std::string>& given, v1::JobSpec* spec) {
  auto has = [&](const char* key) { return given.count(key) > 0; };
  auto either = [&](const char* a, const char* b) -> Status {
    if (has(a) && has(b)) return Invalid(std::string(a) + " and " + b + ": give one or the other, not both");
    return absl::OkStatus();
  };
  // model
  const int sources = has("model.name") + has("model.torchscript") + has("model.exported");
  if (sources > 1)
    return Invalid("model: give one of name (a zoo model), torchscript or exported (your model), not several");
  if (sources == 0)
    return Invalid("model: missing (e.g. model: {name: convnet}, model: {torchscript: model.pt} or model: "
                   "{exported: model.pt2})");
  if (has("model.cut_before") && !has("model.exported"))
    return Invalid("model.cut_before: for an exported program only (model: {exported: PATH})");
  FillModelDefaults(spec->mutable_model());
  // data
  if (has("data.name") && has("data.format")) return Invalid("data: give name or format, not both");
  v1::DataSpec* d = spec->mutable_data();
  if (d->kind() == v1::DATA_UNSPECIFIED) d->set_kind(v1::DATA_SYNTHETIC);
  if (d->kind() == v1::DATA_FASHION_MNIST && !has("data.path")) d->set_path(kDefaultFashionMnistPath);
  if (d->kind() == v1::DATA_TENSORS && !has("data.train"))
    return Invalid("data.train: missing (the file of training inputs and targets)");
  if (d->kind() == v1::DATA_TOKENS) {
    if (!has("data.train")) return Invalid("data.train: missing (the file of training token ids)");
    if (!has("data.dtype")) return Invalid("data.dtype: missing (the width of the file's token ids: uint16 or uint32)");
    if (!has("data.seq_len")) return Invalid("data.seq_len: missing (the tokens in one sample)");
  }
  // partition
  if (has("partition.boundaries") && has("partition.balance"))
    return Invalid("partition: give boundaries or balance, not both");
  // With boundaries alone, one chunk per stage; with virtual_stages the
  // stages must be given too (PartitionLayers checks the counts agree).
  if (has("partition.boundaries") && !has("partition.stages"))
    spec->mutable_partition()->set_stages(spec->partition().boundaries_size() + 1);
  if (spec->schedule() == v1::SCHEDULE_ZBV && !has("virtual_stages")) spec->set_virtual_stages(2);
  // the batch, how long
  CONVEYOR_RETURN_IF_ERROR(either("micro_batches", "split_size"));
  if (!has("micro_batches") && !has("split_size")) spec->set_micro_batches(1);
  CONVEYOR_RETURN_IF_ERROR(either("epochs", "steps"));
  if (!has("epochs") && !has("steps")) spec->set_epochs(1);
  // optimizer
  if (!has("optimizer.lr") && spec->optimizer().kind() != v1::OPTIMIZER_SGD) spec->mutable_optimizer()->set_lr(1e-3);
  if (!has("optimizer.weight_decay") && spec->optimizer().kind() == v1::OPTIMIZER_ADAMW)
    spec->mutable_optimizer()->set_weight_decay(0.01);  // torch.optim.AdamW's default
  // lr_schedule
  if (spec->lr_schedule().decay() == v1::LR_DECAY_STEP && !has("lr_schedule.step_size"))
    return Invalid("lr_schedule.step_size: decay: step needs step_size (the steps between decays)");
  if (!has("optimizer.betas")) {
    spec->mutable_optimizer()->set_beta1(0.9);
    spec->mutable_optimizer()->set_beta2(0.999);
  }
  // loss scaling: always with fp16-mixed; its numbers' defaults are the table's
  if (spec->precision() == v1::PRECISION_FP16_MIXED) {
    if (has("loss_scale.dynamic") && !spec->loss_scale().dynamic())
      return Invalid("loss_scale.dynamic: precision fp16-mixed needs loss scaling (float16 gradients underflow)");
    spec->mutable_loss_scale()->set_dynamic(true);
  }
  // loss
  if (has("loss.name") && has("loss.torchscript"))
    return Invalid("loss: give name (a built-in loss) or torchscript (your own), not both");
  // save
  if (has("save")) {
    if (!has("save.path")) return Invalid("save.path: missing (where the trained weights go)");
    if (!has("save.format")) spec->set_save_format(v1::SAVE_FORMAT_STATE_DICT);
  }
  return absl::OkStatus();
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

// yaml-cpp says "illegal map value" or "end of map not found" for a tab,
// never the tab: names the line that holds one, `error_line` (from 0) first.
std::string TabHint(const std::string& text, int error_line) {
  std::vector<std::string> lines;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    lines.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  int found = -1;
  if (error_line >= 0 && error_line < static_cast<int>(lines.size()) &&
      lines[static_cast<std::size_t>(error_line)].find('\t') != std::string::npos)
    found = error_line;
  for (std::size_t i = 0; found < 0 && i < lines.size(); ++i)
    if (lines[i].find('\t') != std::string::npos) found = static_cast<int>(i);
  if (found < 0) return "";
  const std::string& line = lines[static_cast<std::size_t>(found)];
  return " (line " + std::to_string(found + 1) + " has a tab at column " + std::to_string(line.find('\t') + 1) +
         ": YAML indents with spaces, never tabs; replace it with spaces)";
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
                   ", column " + std::to_string(e.mark.column + 1) + ": " + e.msg + TabHint(yaml_text, e.mark.line));
  }
  if (!root.IsDefined() || root.IsNull()) return Invalid("the job file is empty (it needs at least model: NAME)");
  if (!root.IsMap()) return Invalid("job file: expected a mapping of keys, got a " +
                                    std::string(root.IsSequence() ? "list" : "single value"));
  v1::JobSpec spec;
  try {
    std::set<std::string> given;
    CONVEYOR_RETURN_IF_ERROR(ReadJobKeys(root, &spec, &given));
    CONVEYOR_RETURN_IF_ERROR(Complete(given, &spec));
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

Status CheckSavePath(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      return Invalid("save.path: " + path + " is a folder; name the file to write in it (e.g. " + path + "/weights.pt)");
    if (!S_ISREG(st.st_mode)) return Invalid("save.path: " + path + " is not a regular file");
  }
  // The nearest folder that exists must be one this host may write in (the
  // ones missing are made when the weights are written).
  std::string dir = path;
  for (;;) {
    const auto slash = dir.rfind('/');
    dir = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
    if (::stat(dir.c_str(), &st) == 0) break;
    if (dir == "." || dir == "/") break;
  }
  if (!S_ISDIR(st.st_mode)) return Invalid("save.path: " + dir + " is a file, not a folder, in " + path);
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return absl::PermissionDeniedError("save.path: this host may not write in " + dir + " (" + path + ")");
  return absl::OkStatus();
}

namespace {

// The nearest folder of `path` that exists ("." or "/" at the end).
std::string NearestFolder(const std::string& path) {
  std::string dir = path;
  struct stat st {};
  for (;;) {
    const auto slash = dir.rfind('/');
    dir = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
    if (::stat(dir.c_str(), &st) == 0 || dir == "." || dir == "/") return dir;
  }
}

std::string Bytes(int64_t n) {
  char text[32];
  if (n >= (int64_t{1} << 20)) std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(n) / (1 << 20));
  else if (n >= 1024) std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(n) / 1024);
  else std::snprintf(text, sizeof text, "%lld bytes", static_cast<long long>(n));
  return text;
}

}  // namespace

Status CheckSaveRoom(const v1::JobSpec& spec, const v1::JobStatus& status) {
  if (spec.save_path().empty()) return absl::OkStatus();
  int64_t parameters = 0;
  for (const v1::StageReport& stage : status.stages())
    if (stage.replica() == 0) parameters += stage.num_parameters();
  const int64_t need = parameters * (ActivationDType(spec) == v1::DTYPE_BFLOAT16 ? 2 : 4);
  const std::string dir = NearestFolder(spec.save_path());
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return absl::OkStatus();  // CheckSavePath said what it could
  const int64_t room = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  if (room >= need) return absl::OkStatus();
  return absl::ResourceExhaustedError("save.path: " + dir + " has " + Bytes(room) + " free, the trained weights need about " +
                                      Bytes(need) + " (" + std::to_string(parameters) +
                                      " parameters); free some room there or give another save.path (refused before "
                                      "the first step: nothing was trained)");
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
// yet keeps its name under its resolved folder. "" when the folder is missing
// (with `missing_folders`, folders that do not exist yet keep their names
// under the nearest one that does, unless they hold `..`).
std::string RealPath(const std::string& path, bool* exists, bool missing_folders = false) {
  char buf[PATH_MAX];
  *exists = ::realpath(path.c_str(), buf) != nullptr;
  if (*exists) return buf;
  std::string dir = path, rest;
  for (;;) {
    const auto slash = dir.rfind('/');
    const std::string name = dir.substr(slash == std::string::npos ? 0 : slash + 1);
    if (name == "..") return "";
    rest = rest.empty() ? name : name + "/" + rest;
    dir = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
    if (::realpath(dir.c_str(), buf) != nullptr) break;
    if (!missing_folders || dir == "." || dir == "/") return "";
  }
  const std::string real = buf;
  return (real == "/" ? "" : real) + "/" + rest;
}

bool Under(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

// Resolves a job's paths against the data roots: each made real (symbolic
// links and `..` resolved), relative ones taken under the first root, and
// every one confined to the roots where there are any.
class JobPathResolver {
 public:
  explicit JobPathResolver(const std::vector<std::string>& roots) : roots_(roots) {
    for (const auto& r : roots) {
      bool exists = false;
      std::string real = RealPath(r, &exists);
      if (exists) real_roots_.push_back(real);
    }
    for (const auto& r : roots) listed_ += (listed_.empty() ? "" : ", ") + r;
  }

  // `*path` (key `key`; "" stays "") made real; a file to write
  // (`must_exist` false) may be in folders made when it is written.
  Status Resolve(const char* key, std::string* path, bool must_exist) const {
    if (path->empty()) return absl::OkStatus();
    std::string joined = *path;
    if (joined[0] != '/' && !roots_.empty()) joined = roots_.front() + "/" + joined;
    bool exists = false;
    const std::string real = RealPath(joined, &exists, /*missing_folders=*/!must_exist);
    if (real.empty() || (must_exist && !exists)) {
      // Say which rule made the path, so that the user can give the right one.
      const bool relative = (*path)[0] != '/' && !roots_.empty();
      return absl::NotFoundError(std::string(key) + ": " + joined + " does not exist" +
                                 (relative ? " (" + *path + " is relative: it is taken under the first data root, " +
                                                 roots_.front() + "; give it relative to that folder, or absolute "
                                                 "under one of the data roots: " + listed_ + ")"
                                           : ""));
    }
    if (!roots_.empty()) {
      bool inside = false;
      for (const auto& r : real_roots_) inside |= Under(real, r);
      if (!inside) {
        return absl::PermissionDeniedError(std::string(key) + ": " + *path + " (" + real +
                                           ") is outside the data roots (" + listed_ +
                                           "); a server reads and writes only under its --data-root folders");
      }
    }
    *path = real;
    return absl::OkStatus();
  }

 private:
  const std::vector<std::string>& roots_;
  std::vector<std::string> real_roots_;
  std::string listed_;  // the roots as given, for messages
};

// data.train: one file, a list of shards, or a pattern whose matches become
// the shards.
Status ResolveJobTrainPaths(const std::vector<std::string>& roots, const JobPathResolver& resolver,
                            v1::JobSpec* spec) {
  std::string p = spec->data().train();
  // A list of shards (data.train: [a.pt, b.pt]) keeps `train` empty; a
  // pattern's shards are found again from it.
  const bool shard_list = p.empty() && spec->data().train_shards_size() > 0;
  if (!shard_list) spec->mutable_data()->clear_train_shards();
  if (shard_list) {  // each resolved in place, in the list's order (ValidateJobSpec refused one for tokens)
    for (std::string& f : *spec->mutable_data()->mutable_train_shards())
      CONVEYOR_RETURN_IF_ERROR(resolver.Resolve("data.train", &f, true));
  } else if (p.find_first_of("*?[") != std::string::npos) {
    // Shards: the files the pattern matches, in name order, each resolved
    // (and confined to the roots) as one path would be.
    if (spec->data().kind() != v1::DATA_TENSORS)
      return Invalid("data.train: " + p + " is a pattern; shards are for format: tensors");
    const std::string pattern = p[0] != '/' && !roots.empty() ? roots.front() + "/" + p : p;
    glob_t found{};
    const int r = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &found);
    std::vector<std::string> files(found.gl_pathv, found.gl_pathv + (r == 0 ? found.gl_pathc : 0));
    globfree(&found);
    std::sort(files.begin(), files.end());  // byte order, whatever the locale's collation
    if (files.empty()) {
      return absl::NotFoundError("data.train: the pattern " + pattern + " matches no file" +
                                 (p[0] != '/' && !roots.empty() ? " (it is relative: taken under the first data root, " +
                                                                      roots.front() + ")"
                                                                : ""));
    }
    for (std::string& f : files) {
      CONVEYOR_RETURN_IF_ERROR(resolver.Resolve("data.train", &f, true));
      spec->mutable_data()->add_train_shards(f);
    }
    spec->mutable_data()->set_train(pattern);
  } else {
    CONVEYOR_RETURN_IF_ERROR(resolver.Resolve("data.train", &p, true));
    spec->mutable_data()->set_train(p);
  }
  return absl::OkStatus();
}

}  // namespace

Status ResolveJobPaths(v1::JobSpec* spec, const std::vector<std::string>& roots) {
  const JobPathResolver resolver(roots);
  std::string p = spec->model().torchscript();
  CONVEYOR_RETURN_IF_ERROR(resolver.Resolve("model.torchscript", &p, true));
  spec->mutable_model()->set_torchscript(p);
  p = spec->model().exported();
  CONVEYOR_RETURN_IF_ERROR(resolver.Resolve("model.exported", &p, true));
  spec->mutable_model()->set_exported(p);
  p = spec->data().path();
  if (spec->data().kind() == v1::DATA_FASHION_MNIST) {
    CONVEYOR_RETURN_IF_ERROR(resolver.Resolve("data.path", &p, true));
    spec->mutable_data()->set_path(p);
  }
  CONVEYOR_RETURN_IF_ERROR(ResolveJobTrainPaths(roots, resolver, spec));
  p = spec->data().test();
  CONVEYOR_RETURN_IF_ERROR(resolver.Resolve("data.test", &p, true));
  spec->mutable_data()->set_test(p);
  p = spec->loss_torchscript();
  CONVEYOR_RETURN_IF_ERROR(resolver.Resolve("loss.torchscript", &p, true));
  spec->set_loss_torchscript(p);
  p = spec->init_from();
  CONVEYOR_RETURN_IF_ERROR(resolver.Resolve("init_from", &p, true));
  spec->set_init_from(p);
  p = spec->save_path();
  CONVEYOR_RETURN_IF_ERROR(resolver.Resolve("save.path", &p, false));
  spec->set_save_path(p);
  return CheckJobFiles(*spec);
}

void ApplyDescription(const v1::DescribeReply& r, v1::JobSpec* spec) {
  if (ModelFromFile(spec->model())) {
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

namespace {
// cuda_graphs: true in the job.
bool GraphsAsked(const v1::JobSpec& spec) { return spec.has_cuda_graphs() && spec.cuda_graphs(); }

// Why CUDA graphs cannot work for this job on any device, or "": what
// ValidateJobSpec refuses `true` for and `auto` turns them off for.
std::string GraphsCannotWork(const v1::JobSpec& spec) {
  if (spec.recompute() || spec.recompute_stages_size() > 0)
    return "cannot be combined with recompute (a graph replays the forward that backward reads)";
  if (spec.precision() == v1::PRECISION_BF16_MIXED || spec.precision() == v1::PRECISION_FP16_MIXED)
    return "not with mixed precision yet (autocast's casts are not recorded)";
  if (spec.loss_scale().dynamic()) return "not with loss scaling (a captured graph would keep its first step's scale)";
  return "";
}
}  // namespace

GraphsChoice CudaGraphsFor(const v1::JobSpec& spec, bool reference) {
  if (spec.has_cuda_graphs()) return {spec.cuda_graphs(), spec.cuda_graphs() ? "" : "cuda_graphs: false"};
  auto off = [](std::string why) { return GraphsChoice{false, "cuda_graphs (auto) off: " + std::move(why)}; };
  if (spec.model().kind() == v1::MODEL_TORCHSCRIPT)
    return off("a TorchScript model may not be capturable (set cuda_graphs: true to try)");
  if (spec.model().kind() == v1::MODEL_EXPORTED)
    return off("an exported program is interpreted node by node, not captured (set cuda_graphs: true to try)");
  if (std::string why = GraphsCannotWork(spec); !why.empty()) return off(why);
  if (reference) return {true, ""};
  // Replicas of one stage replay their passes and all-reduce the gradients
  // after them (GradientReducer, unarmed); with links between stages as well
  // the two kinds of NCCL traffic beside replays have not been tried on GPUs.
  if (Replicas(spec) > 1 && spec.partition().stages() > 1)
    return off("replicas of a pipeline of several stages (set cuda_graphs: true to try)");
  if (SplitsBackward(spec.schedule()))
    return off("the " + ScheduleName(spec.schedule()) + " schedule splits backward in two passes");
  const bool one_in_flight = spec.partition().stages() <= 1 || MicroBatchCount(spec, spec.batch_size()) <= 1;
  if (spec.schedule() != v1::SCHEDULE_GPIPE && !one_in_flight)
    return off("graphs would hold every micro-batch's activations, where this schedule holds a few "
               "(set cuda_graphs: true to trade that memory for fewer launches)");
  return {true, ""};
}

namespace {

// The rules between a job's checks below run in this order: the first a job
// breaks is the one it is told.

// The model's keys against its kind.
Status ValidateJobModelKeys(const v1::JobSpec& spec) {
  const auto& m = spec.model();
  if (m.kind() == v1::MODEL_TOY && m.num_classes() != 0 && m.num_classes() != 5)
    return Invalid("model.num_classes: the toy model has 5 outputs");
  const bool gpt = m.kind() == v1::MODEL_GPT;
  const bool script = m.kind() == v1::MODEL_TORCHSCRIPT;
  if (script && m.torchscript().empty()) return Invalid("model.torchscript: missing");
  if (!script && !m.torchscript().empty()) return Invalid("model.torchscript: for a TorchScript model only");
  const bool exported = m.kind() == v1::MODEL_EXPORTED;
  if (exported && m.exported().empty()) return Invalid("model.exported: missing");
  if (!exported && !m.exported().empty()) return Invalid("model.exported: for an exported program only");
  if (!exported && !m.cut_before().empty()) return Invalid("model.cut_before: for an exported program only");
  if (!gpt && (m.vocab() || m.width() || m.blocks() || m.heads() || m.mlp_width() || m.seq_len()))
    return Invalid("model: vocab, width, blocks, heads, mlp_width and seq_len are for the gpt model only");
  if (m.kind() != v1::MODEL_RESNET50 && m.image_size() != 0)
    return Invalid("model.image_size: for the resnet50 model only");
  if (gpt) {
    if (!m.vocab() || !m.width() || !m.blocks() || !m.heads() || !m.mlp_width() || !m.seq_len())
      return Invalid("model: a gpt model needs vocab, width, blocks, heads, mlp_width and seq_len");
    if (m.width() % m.heads() != 0)
      return Invalid("model.heads: " + std::to_string(m.heads()) + " does not divide width " + std::to_string(m.width()));
  }
  if (m.kind() == v1::MODEL_RESNET50 && m.image_size() == 0) return Invalid("model.image_size: missing");
  if (m.kind() == v1::MODEL_MLP) {
    for (int h : m.hidden())
      if (h <= 0 || h > 1000000) return Invalid("model.hidden: widths must be positive, got " + std::to_string(h));
  } else if (m.input_dim() != 0 || m.hidden_size() != 0) {
    return Invalid("model: input_dim and hidden are for the mlp model only");
  }
  if (spec.loss() == v1::LOSS_MSE && gpt) return Invalid("loss: mse is not for the gpt model (its targets are tokens)");
  return absl::OkStatus();
}

// fashion-mnist's folder, and a model that takes its images and classes.
Status ValidateJobFashionMnist(const v1::JobSpec& spec) {
  const auto& m = spec.model();
  const auto& d = spec.data();
  if (d.kind() != v1::DATA_FASHION_MNIST) return absl::OkStatus();
  if (d.path().empty()) return Invalid("data.path: missing");
  bool image_model = ModelFromFile(m) || m.kind() == v1::MODEL_CONVNET ||
                     (m.kind() == v1::MODEL_MLP && (m.input_dim() == 0 || m.input_dim() == 784));
  if (!image_model)
    return Invalid("data: fashion-mnist gives 1x28x28 images; use convnet or mlp (input_dim 784)");
  if (m.num_classes() != 0 && m.num_classes() != 10)
    return Invalid("model.num_classes: fashion-mnist has 10 classes");
  return absl::OkStatus();
}

// How a batch splits into micro-batches, and over replicas.
Status ValidateJobBatchSplit(const v1::JobSpec& spec) {
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
  // Each micro-batch is a message between every pair of stages and a slot in
  // every schedule: past this, a step is all overhead.
  constexpr int64_t kMaxMicroBatches = 65536;
  const int64_t m = MicroBatchCount(spec, spec.batch_size());
  if (m > kMaxMicroBatches)
    return Invalid((spec.split_size() > 0 ? "split_size: batch_size " + std::to_string(spec.batch_size()) +
                                                " with split_size " + std::to_string(spec.split_size()) + " makes "
                                          : "micro_batches: ") +
                   std::to_string(m) + " micro-batches, more than " + std::to_string(kMaxMicroBatches) +
                   ": give fewer micro_batches or a larger split_size");
  if (Replicas(spec) > 1) {
    const int r = Replicas(spec);
    if (spec.batch_size() % r != 0)
      return Invalid("replicas: batch_size " + std::to_string(spec.batch_size()) + " does not split evenly over " +
                     std::to_string(r) + " replicas");
    const int64_t share = spec.batch_size() / r;
    if (spec.micro_batches() > share || spec.split_size() > share)
      return Invalid("replicas: each of the " + std::to_string(r) + " replicas gets " + std::to_string(share) +
                     " samples of a batch, fewer than " +
                     (spec.micro_batches() > 0 ? "micro_batches " + std::to_string(spec.micro_batches())
                                               : "split_size " + std::to_string(spec.split_size())));
  }
  return absl::OkStatus();
}

// The optimizer, the learning rate's schedule, the loss and how long the
// job trains.
Status ValidateJobTraining(const v1::JobSpec& spec) {
  const auto& o = spec.optimizer();
  if (o.kind() == v1::OPTIMIZER_UNSPECIFIED) return Invalid("optimizer.name: missing");
  if (o.kind() != v1::OPTIMIZER_SGD && (o.beta1() < 0 || o.beta1() >= 1 || o.beta2() < 0 || o.beta2() >= 1))
    return Invalid("optimizer.betas: each must be in [0, 1)");
  if (o.nesterov() && (o.kind() != v1::OPTIMIZER_SGD || o.momentum() <= 0))
    return Invalid("optimizer.nesterov: needs sgd with a positive momentum");
  const auto& ls = spec.lr_schedule();
  if (ls.min_lr() > o.lr()) return Invalid("lr_schedule.min_lr: must be between 0 and optimizer.lr");
  if (ls.decay() == v1::LR_DECAY_STEP && (ls.step_size() < 1 || !(ls.gamma() > 0) || ls.gamma() > 1))
    return Invalid("lr_schedule: decay: step needs step_size >= 1 and 0 < gamma <= 1");
  if (spec.loss() == v1::LOSS_UNSPECIFIED && spec.loss_torchscript().empty()) return Invalid("loss: missing");
  if (spec.epochs() < 0 || spec.steps() < 0 || (spec.epochs() == 0 && spec.steps() == 0))
    return Invalid("epochs/steps: must be positive");
  if (spec.epochs() > 100000 || spec.steps() > 1000000000) return Invalid("epochs/steps: too large");
  if (spec.matmul_sm_carveout() == v1::SM_CARVEOUT_FIXED &&
      (spec.matmul_sm_carveout_sms() < 1 || spec.matmul_sm_carveout_sms() > 64))
    return Invalid("matmul_sm_carveout: must be off, auto or 1 to 64 SMs");
  if (spec.commit_steps() && Replicas(spec) < 2)
    return Invalid("commit_steps: keeps the other replicas whole when one is lost: it needs replicas of 2 or more");
  if (spec.commit_steps() && spec.zero_stage() > 0)
    return Invalid("commit_steps: cannot keep a zero 1 job's state when a replica is lost (that replica's slice of "
                   "the optimizer state was on its servers alone); leave out commit_steps or zero");
  if (spec.steps() > 0 && spec.profile_step() > spec.steps())
    return Invalid("profile_step: " + std::to_string(spec.profile_step()) + " is past the job's last step (" +
                   std::to_string(spec.steps()) + ")");
  return absl::OkStatus();
}

// The schedule's chunks, cuda_graphs, and the keys that name stages.
Status ValidateJobStageKeys(const v1::JobSpec& spec) {
  if (spec.schedule() == v1::SCHEDULE_INTERLEAVED) {
    if (spec.virtual_stages() < 2) return Invalid("virtual_stages: the interleaved schedule needs 2 or more");
    const int64_t m = MicroBatchCount(spec, spec.batch_size());
    if (m % spec.partition().stages() != 0) {
      return Invalid("micro_batches: the interleaved schedule needs a multiple of the stages (" +
                     std::to_string(spec.partition().stages()) + "), got " + std::to_string(m));
    }
  } else if (spec.schedule() == v1::SCHEDULE_ZBV) {
    if (spec.virtual_stages() != 2)
      return Invalid("virtual_stages: the zbv schedule places two chunks on each stage (leave virtual_stages out, or "
                     "give 2)");
  } else if (spec.virtual_stages() != 1) {
    return Invalid("virtual_stages: only the interleaved and zbv schedules host several chunks per stage");
  }
  if (GraphsAsked(spec)) {
    if (std::string why = GraphsCannotWork(spec); !why.empty()) return Invalid("cuda_graphs: " + why);
  }
  for (const auto& g : spec.inject_inf_gradients())
    if (g.stage() >= spec.partition().stages())
      return Invalid("inject_inf_gradients: stage " + std::to_string(g.stage()) + " is not one of the job's stages");
  if (GraphsAsked(spec) && SplitsBackward(spec.schedule()))
    return Invalid("cuda_graphs: cannot be combined with the " + ScheduleName(spec.schedule()) +
                   " schedule (its backward is split in two passes)");
  for (int s : spec.recompute_stages())
    if (s < 0 || s >= spec.partition().stages())
      return Invalid("recompute: stage " + std::to_string(s) + " is not one of the job's stages");
  return absl::OkStatus();
}

// The data files, the test split an evaluation needs, and token data's keys.
Status ValidateJobDataFiles(const v1::JobSpec& spec) {
  const auto& m = spec.model();
  const auto& d = spec.data();
  const bool gpt = m.kind() == v1::MODEL_GPT;
  if ((d.kind() == v1::DATA_TENSORS || d.kind() == v1::DATA_TOKENS) && d.train().empty() && d.train_shards().empty())
    return Invalid("data.train: missing");
  if (d.kind() == v1::DATA_TOKENS && !d.train_shards().empty())
    return Invalid("data.train: a list of files is for format: tensors; tokens read one file");
  // An evaluation over no test data would report 0% and perplexity 1 as if measured.
  if (spec.eval() && d.kind() == v1::DATA_SYNTHETIC && d.test_samples() == 0)
    return Invalid("eval: true, but data.test_samples is 0: there is no test split to evaluate on "
                   "(give data.test_samples, or eval: false)");
  if (spec.eval() && (d.kind() == v1::DATA_TENSORS || d.kind() == v1::DATA_TOKENS) && d.test().empty())
    return Invalid("eval: true, but data.test names no test file to evaluate on (give data.test, or eval: false)");
  if (d.kind() == v1::DATA_TOKENS) {
    if (TokenWidth(d.token_dtype()) == 0) return Invalid("data.dtype: missing (uint16 or uint32)");
    if (d.seq_len() == 0) return Invalid("data.seq_len: missing");
    if (!ModelFromFile(m) && !gpt)
      return Invalid("data: tokens give int64 token ids [batch, seq_len]; use the gpt model or a TorchScript or exported one");
    if (gpt && d.seq_len() > m.seq_len())
      return Invalid("data.seq_len: " + std::to_string(d.seq_len()) + " is longer than model.seq_len " +
                     std::to_string(m.seq_len()));
  } else if (d.token_dtype() != v1::TOKEN_DTYPE_UNSPECIFIED || d.seq_len() != 0) {
    return Invalid("data: dtype and seq_len are for format: tokens only");
  }
  return absl::OkStatus();
}

// save's keys, a model file's precision, and the layers the stages split.
Status ValidateJobSaveAndLayers(const v1::JobSpec& spec) {
  const auto& m = spec.model();
  if (spec.save_format() != v1::SAVE_FORMAT_UNSPECIFIED && spec.save_path().empty()) return Invalid("save.path: missing");
  if (spec.save_format() == v1::SAVE_FORMAT_TORCHSCRIPT && m.kind() != v1::MODEL_TORCHSCRIPT)
    return Invalid("save.format: torchscript needs a model from a TorchScript archive (model: {torchscript: PATH}); "
                   "the zoo's " + ModelName(m.kind()) + " saves as state_dict only");
  if (ModelFromFile(m) && spec.precision() != v1::PRECISION_FP32 && spec.precision() != v1::PRECISION_BF16 &&
      spec.precision() != v1::PRECISION_BF16_MIXED && spec.precision() != v1::PRECISION_FP16_MIXED)
    return Invalid("precision: unknown");
  // A TorchScript model's or exported program's layers are counted when the
  // job is placed (stage 0 reads the file); a zoo model's are known now.
  if (ModelFromFile(m) && m.num_layers() == 0) {
    int64_t last = 0;
    for (int b : spec.partition().boundaries()) {
      if (b <= last) return Invalid("partition.boundaries: must be increasing and positive");
      last = b;
    }
    return absl::OkStatus();
  }
  return PartitionLayers(spec).status();
}

}  // namespace

Status ValidateJobSpec(const v1::JobSpec& spec) {
  if (spec.model().kind() == v1::MODEL_UNSPECIFIED) return Invalid("model.name: missing");
  // Each number within its key's range (job_keys.h); the rules between keys follow.
  CONVEYOR_RETURN_IF_ERROR(CheckKeyRanges(spec));
  CONVEYOR_RETURN_IF_ERROR(ValidateJobModelKeys(spec));
  if (spec.data().kind() == v1::DATA_UNSPECIFIED) return Invalid("data.name: missing");
  if (spec.precision() == v1::PRECISION_UNSPECIFIED) return Invalid("precision: missing");
  CONVEYOR_RETURN_IF_ERROR(ValidateJobFashionMnist(spec));
  CONVEYOR_RETURN_IF_ERROR(ValidateJobBatchSplit(spec));
  if (spec.schedule() == v1::SCHEDULE_UNSPECIFIED) return Invalid("schedule: missing");
  CONVEYOR_RETURN_IF_ERROR(ValidateJobTraining(spec));
  CONVEYOR_RETURN_IF_ERROR(ValidateJobStageKeys(spec));
  CONVEYOR_RETURN_IF_ERROR(ValidateJobDataFiles(spec));
  return ValidateJobSaveAndLayers(spec);
}

std::string ScheduleName(v1::ScheduleKind kind) {
  if (kind == v1::SCHEDULE_REFERENCE) return "reference";
  for (const auto& [n, k] : KeyChoices("schedule"))
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

int64_t TokensPerSample(const v1::JobSpec& spec) {
  if (spec.data().kind() == v1::DATA_TOKENS && spec.data().seq_len() > 0) return spec.data().seq_len();
  if (spec.model().kind() == v1::MODEL_GPT) return spec.model().seq_len();
  return 0;
}

std::string CollectiveName(v1::CollectiveKind kind) {
  switch (kind) {
    case v1::COLLECTIVES_GLOO: return "gloo";
    case v1::COLLECTIVES_NCCL: return "nccl";
    default: return "";
  }
}

std::string ModelName(v1::ModelKind kind) {
  if (kind == v1::MODEL_TORCHSCRIPT) return "torchscript";
  if (kind == v1::MODEL_EXPORTED) return "exported";
  for (const auto& [n, k] : KeyChoices("model.name"))
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
  const double m = static_cast<double>(MicroBatchCount(spec, spec.batch_size()));
  const double v = std::max(1, spec.virtual_stages());
  switch (spec.schedule()) {
    case v1::SCHEDULE_INTERLEAVED: return (p - 1) / (v * m + p - 1);
    case v1::SCHEDULE_ZERO_BUBBLE: return (p - 1) / (m + p - 1) / 3;
    case v1::SCHEDULE_ZBV: return (p - 1) / (2 * m + p - 1) / 3;
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

int Replicas(const v1::JobSpec& spec) { return std::max(1, spec.replicas()); }

ReplicaShare ShareOf(const v1::JobSpec& spec, int64_t batch, int replica) {
  const int64_t r = Replicas(spec);
  return {batch * replica / r, batch * (replica + 1) / r - batch * replica / r};
}

std::vector<int64_t> MicroBatchSizes(const v1::JobSpec& spec, int64_t batch) {
  std::vector<int64_t> sizes;
  const int64_t m = MicroBatchCount(spec, batch);
  sizes.reserve(static_cast<std::size_t>(m));
  if (spec.split_size() > 0) {
    for (int64_t start = 0; start < batch; start += spec.split_size())
      sizes.push_back(std::min<int64_t>(spec.split_size(), batch - start));
    return sizes;
  }
  for (int64_t i = 0; i < m; ++i) sizes.push_back(batch / m + (i < batch % m ? 1 : 0));
  return sizes;
}

int64_t MicroBatchCount(const v1::JobSpec& spec, int64_t batch) {
  if (batch <= 0) return 0;
  if (spec.split_size() > 0) return (batch + spec.split_size() - 1) / spec.split_size();
  return std::min<int64_t>(std::max(spec.micro_batches(), 1), batch);
}

}  // namespace conveyor
