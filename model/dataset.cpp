#include "model/dataset.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <tuple>

#include "plan/job_spec.h"
#include "plan/model_catalog.h"
#include "model/state_dict.h"

namespace conveyor {

uint64_t MixSeed(uint64_t seed, uint64_t salt) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (salt + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

namespace {

class GzFile {
 public:
  explicit GzFile(const std::string& path) : f_(gzopen(path.c_str(), "rb")) {}
  ~GzFile() {
    if (f_) gzclose(f_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  bool ok() const { return f_ != nullptr; }
  bool Read(void* buf, std::size_t n) {
    char* p = static_cast<char*>(buf);
    while (n > 0) {
      unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n, 1u << 30));
      int got = gzread(f_, p, chunk);
      if (got <= 0) return false;
      p += got;
      n -= static_cast<std::size_t>(got);
    }
    return true;
  }

 private:
  gzFile f_;
};

struct IdxHeader {
  std::vector<int64_t> dims;
};

Status ReadIdxHeader(GzFile& f, const std::string& path, IdxHeader* header) {
  unsigned char magic[4];
  if (!f.Read(magic, 4)) return absl::InvalidArgumentError(path + ": empty or not gzip");
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] == 0 || magic[3] > 4)
    return absl::InvalidArgumentError(path + ": not an IDX file of unsigned bytes");
  for (int i = 0; i < magic[3]; ++i) {
    unsigned char b[4];
    if (!f.Read(b, 4)) return absl::InvalidArgumentError(path + ": truncated IDX header");
    header->dims.push_back((int64_t{b[0]} << 24) | (b[1] << 16) | (b[2] << 8) | b[3]);
  }
  return absl::OkStatus();
}

Status CheckExists(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return absl::NotFoundError("dataset file " + path + " does not exist");
  return absl::OkStatus();
}

StatusOr<at::Tensor> ReadIdx(const std::string& path, std::vector<int64_t> want_tail) {
  CONVEYOR_RETURN_IF_ERROR(CheckExists(path));
  GzFile f(path);
  if (!f.ok()) return absl::NotFoundError("cannot open dataset file " + path);
  IdxHeader h;
  CONVEYOR_RETURN_IF_ERROR(ReadIdxHeader(f, path, &h));
  std::vector<int64_t> tail(h.dims.begin() + 1, h.dims.end());
  if (tail != want_tail) return absl::InvalidArgumentError(path + ": unexpected item shape");
  if (h.dims[0] <= 0 || h.dims[0] > 10000000) return absl::InvalidArgumentError(path + ": bad item count");
  at::Tensor t = at::empty(h.dims, at::kByte);
  if (!f.Read(t.data_ptr(), static_cast<std::size_t>(t.numel())))
    return absl::InvalidArgumentError(path + ": truncated data");
  return t;
}

}  // namespace

// One token file, mapped read-only; unmapped by the destructor.
class TokenFile {
 public:
  // NOT_FOUND for a missing file; INVALID_ARGUMENT naming `key` and the path
  // for one that is not a whole number of token ids (TokenSamples).
  static StatusOr<std::unique_ptr<TokenFile>> Open(const v1::DataSpec& data, const std::string& key,
                                                   const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return absl::NotFoundError(key + ": " + path + " does not exist");
      return absl::PermissionDeniedError(key + ": cannot open " + path + ": " + std::strerror(errno));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(key + ": " + path + " is not a regular file");
    }
    std::unique_ptr<TokenFile> f(new TokenFile());
    f->bytes_ = static_cast<std::size_t>(st.st_size);
    f->width_ = TokenWidth(data.token_dtype());
    f->seq_len_ = data.seq_len();
    auto samples = TokenSamples(data, key, path, static_cast<int64_t>(st.st_size));
    if (!samples.ok()) {
      ::close(fd);
      return samples.status();
    }
    f->samples_ = *samples;
    if (f->bytes_ > 0) {
      void* map = ::mmap(nullptr, f->bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
      const int mmap_errno = errno;
      ::close(fd);  // the mapping keeps the file
      if (map == MAP_FAILED)
        return absl::ResourceExhaustedError(key + ": cannot map " + path + ": " + std::strerror(mmap_errno));
      f->base_ = static_cast<const unsigned char*>(map);
    } else {
      ::close(fd);
    }
    return f;
  }
  ~TokenFile() {
    if (base_ != nullptr) ::munmap(const_cast<unsigned char*>(base_), bytes_);
  }
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t samples() const { return samples_; }

  // Windows `idx` (sample indices, each < samples()) as int64 [n, seq_len]:
  // tokens[i*N + shift : i*N + N + shift]; shift 0 for inputs, 1 for targets.
  at::Tensor Gather(const at::Tensor& idx, int64_t shift, bool pinned) const {
    const at::Tensor rows = idx.to(at::kLong).contiguous();
    const int64_t n = rows.numel(), len = seq_len_;
    at::Tensor out = at::empty({n, len}, at::TensorOptions(at::kLong).pinned_memory(pinned));
    const int64_t* r = rows.data_ptr<int64_t>();
    int64_t* o = out.data_ptr<int64_t>();
    for (int64_t k = 0; k < n; ++k) {
      const unsigned char* src = base_ + static_cast<std::size_t>((r[k] * len + shift) * width_);
      int64_t* dst = o + k * len;
      if (width_ == 2) {
        for (int64_t j = 0; j < len; ++j) {
          uint16_t v;
          std::memcpy(&v, src + 2 * j, 2);  // little-endian hosts only, as the files
          dst[j] = v;
        }
      } else {
        for (int64_t j = 0; j < len; ++j) {
          uint32_t v;
          std::memcpy(&v, src + 4 * j, 4);
          dst[j] = v;  // ids >= 2^31 stay positive in int64
        }
      }
    }
    return out;
  }

 private:
  TokenFile() = default;

  const unsigned char* base_ = nullptr;  // the mapping; null for an empty file
  std::size_t bytes_ = 0;
  int width_ = 2;
  int64_t seq_len_ = 1;
  int64_t samples_ = 0;
};

Dataset::~Dataset() = default;

at::Tensor Dataset::SampleOf(bool inputs) const {
  if (train_tokens_) return train_tokens_->Gather(at::zeros({1}, at::kLong), inputs ? 0 : 1, false)[0];
  return (inputs ? train_x_ : train_y_)[0];
}

StatusOr<int64_t> IdxItemCount(const std::string& path) {
  CONVEYOR_RETURN_IF_ERROR(CheckExists(path));
  GzFile f(path);
  if (!f.ok()) return absl::NotFoundError("cannot open dataset file " + path);
  IdxHeader h;
  CONVEYOR_RETURN_IF_ERROR(ReadIdxHeader(f, path, &h));
  return h.dims[0];
}

namespace {

// A split's sample count and tensors, where the Dataset being opened keeps
// them: the readers below fill them in place.
struct DatasetSplitSlots {
  int64_t* size;
  at::Tensor* x;
  at::Tensor* y;
};

// Debian's dataset-fashion-mnist folder: the counts from the label files,
// then the images and labels asked for.
Status DatasetReadFashionMnist(const std::string& dir, bool inputs, bool labels, DatasetSplitSlots train,
                               DatasetSplitSlots test) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return absl::NotFoundError("data.path " + dir + " is not a directory (install Debian's dataset-fashion-mnist)");
  auto file = [&](const char* name) { return dir + "/" + name; };
  CONVEYOR_ASSIGN_OR_RETURN(*train.size, IdxItemCount(file("train-labels-idx1-ubyte.gz")));
  CONVEYOR_ASSIGN_OR_RETURN(*test.size, IdxItemCount(file("t10k-labels-idx1-ubyte.gz")));
  if (inputs) {
    CONVEYOR_ASSIGN_OR_RETURN(*train.x, ReadIdx(file("train-images-idx3-ubyte.gz"), {28, 28}));
    CONVEYOR_ASSIGN_OR_RETURN(*test.x, ReadIdx(file("t10k-images-idx3-ubyte.gz"), {28, 28}));
    *train.x = train.x->unsqueeze(1);
    *test.x = test.x->unsqueeze(1);
  }
  if (labels) {
    CONVEYOR_ASSIGN_OR_RETURN(*train.y, ReadIdx(file("train-labels-idx1-ubyte.gz"), {}));
    CONVEYOR_ASSIGN_OR_RETURN(*test.y, ReadIdx(file("t10k-labels-idx1-ubyte.gz"), {}));
    *train.y = train.y->to(at::kLong);
    *test.y = test.y->to(at::kLong);
  }
  if ((inputs && train.x->size(0) != *train.size) || (inputs && test.x->size(0) != *test.size))
    return absl::InvalidArgumentError(dir + ": image and label files disagree on the count");
  return absl::OkStatus();
}

// A tensors file's "inputs" and "targets", as many of each.
Status DatasetLoadTensorFile(const std::string& key, const std::string& path, at::Tensor* x, at::Tensor* y) {
  CONVEYOR_ASSIGN_OR_RETURN(auto dict, ReadTensorDict(path));
  auto in = dict.find("inputs"), out = dict.find("targets");
  if (in == dict.end() || out == dict.end())
    return absl::InvalidArgumentError(key + ": " + path + " has no \"inputs\" and \"targets\" (a file written by "
                                      "torch.save({\"inputs\": X, \"targets\": Y}, PATH))");
  if (in->second.dim() == 0 || out->second.dim() == 0 || in->second.size(0) != out->second.size(0)) {
    return absl::InvalidArgumentError(key + ": " + path + " has " + std::to_string(in->second.dim() ? in->second.size(0) : 0) +
                                      " inputs and " + std::to_string(out->second.dim() ? out->second.size(0) : 0) +
                                      " targets (the first dimension is the sample)");
  }
  *x = in->second;
  *y = out->second;
  return absl::OkStatus();
}

// Each of data.train's shards, whose samples must be alike (dtype and shape)
// across shards; `rows` gets each shard's first row, counted over them all,
// and the total.
Status DatasetLoadTensorShards(const v1::DataSpec& data, std::vector<at::Tensor>* shard_x,
                               std::vector<at::Tensor>* shard_y, std::vector<int64_t>* rows) {
  *rows = {0};
  auto alike = [](const at::Tensor& a, const at::Tensor& b) {
    return a.scalar_type() == b.scalar_type() && a.sizes().slice(1) == b.sizes().slice(1);
  };
  auto describe = [](const at::Tensor& t) {
    return std::string(c10::toString(t.scalar_type())) + " samples of shape " + c10::str(t.sizes().slice(1));
  };
  for (const std::string& path : data.train_shards()) {
    at::Tensor x, y;
    CONVEYOR_RETURN_IF_ERROR(DatasetLoadTensorFile("data.train", path, &x, &y));
    if (!shard_x->empty()) {
      for (const auto& [name, mine, first] : {std::make_tuple("inputs", x, (*shard_x)[0]),
                                              std::make_tuple("targets", y, (*shard_y)[0])}) {
        if (alike(mine, first)) continue;
        return absl::InvalidArgumentError("data.train: the shard " + path + " holds " + name + " of " +
                                          describe(mine) + ", the first shard " + data.train_shards(0) + " " +
                                          describe(first) + ": every shard's samples must be alike");
      }
    }
    shard_x->push_back(x);
    shard_y->push_back(y);
    rows->push_back(rows->back() + x.size(0));
  }
  return absl::OkStatus();
}

// Random samples for data: synthetic, each split's inputs and labels from
// generators seeded by the job's seed.
void DatasetDrawSynthetic(const v1::JobSpec& spec, bool inputs, bool labels, DatasetSplitSlots train,
                          DatasetSplitSlots test) {
  std::vector<int64_t> shape = InputSampleShape(spec);
  std::vector<int64_t> label_shape = LabelSampleShape(spec);
  const int64_t classes = NumClasses(spec.model());
  const bool tokens = InputDType(spec) == v1::DTYPE_INT64;
  auto make = [&](int64_t n, uint64_t salt, at::Tensor* x, at::Tensor* y) {
    at::Generator gx = at::make_generator<at::CPUGeneratorImpl>(MixSeed(spec.seed(), salt));
    at::Generator gy = at::make_generator<at::CPUGeneratorImpl>(MixSeed(spec.seed(), salt + 1));
    std::vector<int64_t> full{n}, full_labels{n};
    full.insert(full.end(), shape.begin(), shape.end());
    full_labels.insert(full_labels.end(), label_shape.begin(), label_shape.end());
    // Each is drawn only when asked for, from its own generator.
    if (inputs) *x = tokens ? at::randint(classes, full, gx, at::kLong) : at::randn(full, gx, at::kFloat);
    if (labels) *y = at::randint(classes, full_labels, gy, at::kLong);
  };
  make(*train.size, 100, train.x, train.y);
  make(*test.size, 200, test.x, test.y);
}

}  // namespace

StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const v1::JobSpec& spec, bool inputs, bool labels) {
  std::unique_ptr<Dataset> d(new Dataset());
  d->spec_ = spec;
  const v1::DataSpec& data = spec.data();
  const DatasetSplitSlots train{&d->train_size_, &d->train_x_, &d->train_y_};
  const DatasetSplitSlots test{&d->test_size_, &d->test_x_, &d->test_y_};
  if (data.kind() == v1::DATA_FASHION_MNIST) {
    CONVEYOR_RETURN_IF_ERROR(DatasetReadFashionMnist(data.path(), inputs, labels, train, test));
  } else if (data.kind() == v1::DATA_TOKENS) {
    d->scale_bytes_ = false;
    CONVEYOR_ASSIGN_OR_RETURN(d->train_tokens_, TokenFile::Open(data, "data.train", data.train()));
    d->train_size_ = d->train_tokens_->samples();
    if (!data.test().empty()) {
      CONVEYOR_ASSIGN_OR_RETURN(d->test_tokens_, TokenFile::Open(data, "data.test", data.test()));
      d->test_size_ = d->test_tokens_->samples();
    }
  } else if (data.kind() == v1::DATA_TENSORS) {
    d->scale_bytes_ = false;
    if (data.train_shards_size() == 0) {
      CONVEYOR_RETURN_IF_ERROR(DatasetLoadTensorFile("data.train", data.train(), &d->train_x_, &d->train_y_));
      d->train_size_ = d->train_x_.size(0);
    } else {
      CONVEYOR_RETURN_IF_ERROR(DatasetLoadTensorShards(data, &d->shard_x_, &d->shard_y_, &d->shard_rows_));
      d->train_x_ = d->shard_x_.front();
      d->train_y_ = d->shard_y_.front();
      d->train_size_ = d->shard_rows_.back();
    }
    if (!data.test().empty()) {
      CONVEYOR_RETURN_IF_ERROR(DatasetLoadTensorFile("data.test", data.test(), &d->test_x_, &d->test_y_));
      d->test_size_ = d->test_x_.size(0);
    }
    if (!inputs) {
      d->train_x_ = d->test_x_ = at::Tensor();
      d->shard_x_.clear();
    }
    if (!labels) {
      d->train_y_ = d->test_y_ = at::Tensor();
      d->shard_y_.clear();
    }
  } else {
    d->train_size_ = data.train_samples();
    d->test_size_ = data.test_samples();
    DatasetDrawSynthetic(spec, inputs, labels, train, test);
  }
  if (d->train_size_ < spec.batch_size())
    return absl::InvalidArgumentError("batch_size " + std::to_string(spec.batch_size()) +
                                      " is larger than the training split (" +
                                      std::to_string(d->train_size_) + " samples)");
  return d;
}

int64_t Dataset::StepsPerEpoch() const { return train_size_ / spec_.batch_size(); }

int64_t Dataset::EvalBatches() const {
  return (test_size_ + spec_.eval_batch_size() - 1) / spec_.eval_batch_size();
}

int64_t Dataset::BatchSize(v1::Phase phase, int64_t step) const {
  if (phase == v1::PHASE_TRAIN) return spec_.batch_size();
  int64_t eb = spec_.eval_batch_size();
  return std::max<int64_t>(0, std::min(eb, test_size_ - step * eb));
}

at::Tensor Dataset::Indices(v1::Phase phase, int64_t step) {
  if (phase == v1::PHASE_EVAL) {
    int64_t eb = spec_.eval_batch_size();
    return at::arange(step * eb, step * eb + BatchSize(phase, step), at::kLong);
  }
  const int64_t per_epoch = StepsPerEpoch();
  const int64_t epoch = step / per_epoch, pos = step % per_epoch;
  const int64_t b = spec_.batch_size();
  const ReplicaShare share = replica_ < 0 ? ReplicaShare{0, b} : ShareOf(spec_, b, replica_);
  const int64_t first = pos * b + share.offset;
  if (spec_.data().no_shuffle()) return at::arange(first, first + share.size, at::kLong);  // file order
  at::Tensor perm;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = perms_.find(epoch);
    if (it == perms_.end()) {
      at::Generator g = at::make_generator<at::CPUGeneratorImpl>(MixSeed(spec_.seed(), 1000 + epoch));
      it = perms_.emplace(epoch, at::randperm(train_size_, g, at::kLong)).first;
      while (perms_.size() > 2) perms_.erase(perms_.begin());
    }
    perm = it->second;
  }
  return perm.slice(0, first, first + share.size);
}

namespace {

// x's rows `idx`, in a new tensor of `dtype` (pinned if asked): one pass
// over the rows when no conversion is needed.
at::Tensor GatherRows(const at::Tensor& x, const at::Tensor& idx, at::ScalarType dtype, bool pinned) {
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[0] = idx.numel();
  at::Tensor out = at::empty(sizes, x.options().dtype(dtype).pinned_memory(pinned));
  if (dtype == x.scalar_type()) return at::index_select_out(out, x, 0, idx);
  return out.copy_(x.index_select(0, idx));
}

// The rows `idx` of the shards `parts` taken as one tensor (shard k holds
// rows [rows[k], rows[k+1])), in a new tensor, pinned if asked: each shard's
// rows gathered at once.
at::Tensor GatherShardRows(const std::vector<at::Tensor>& parts, const std::vector<int64_t>& rows,
                           const at::Tensor& idx, bool pinned) {
  const at::Tensor& first = parts.front();
  std::vector<int64_t> sizes = first.sizes().vec();
  sizes[0] = idx.numel();
  at::Tensor out = at::empty(sizes, first.options().pinned_memory(pinned));
  const at::Tensor flat = idx.contiguous();
  const int64_t* ix = flat.data_ptr<int64_t>();
  std::map<std::size_t, std::pair<std::vector<int64_t>, std::vector<int64_t>>> by_shard;  // positions, local rows
  for (int64_t i = 0; i < flat.numel(); ++i) {
    const std::size_t k = static_cast<std::size_t>(std::upper_bound(rows.begin(), rows.end(), ix[i]) - rows.begin()) - 1;
    by_shard[k].first.push_back(i);
    by_shard[k].second.push_back(ix[i] - rows[k]);
  }
  for (const auto& [k, taken] : by_shard) {
    out.index_copy_(0, at::tensor(taken.first, at::kLong), parts[k].index_select(0, at::tensor(taken.second, at::kLong)));
  }
  return out;
}

}  // namespace

Status Dataset::CheckTargets(const std::vector<int64_t>& output_sample_shape) const {
  const v1::JobSpec& spec = spec_;
  if (spec.data().kind() != v1::DATA_TENSORS || !spec.loss_torchscript().empty() ||
      spec.loss() == v1::LOSS_BCE_WITH_LOGITS || output_sample_shape.empty())
    return absl::OkStatus();
  const char* loss = spec.loss() == v1::LOSS_NLL ? "nll" : spec.loss() == v1::LOSS_MSE ? "mse" : "cross_entropy";
  auto shape = [](at::IntArrayRef s) { return c10::str(s); };
  auto check = [&](const std::string& key, const std::string& path, const at::Tensor& y) -> Status {
    if (!y.defined() || y.numel() == 0) return absl::OkStatus();
    const std::string where = key + ": " + path + ": ";
    if (at::isFloatingType(y.scalar_type())) {
      if (spec.loss() == v1::LOSS_MSE) return absl::OkStatus();  // regression targets
      return absl::InvalidArgumentError(where + "its targets are " + std::string(c10::toString(y.scalar_type())) +
                                        ", and " + loss + " takes class indices, int64 (save them with "
                                        "targets.long(); float targets suit mse and bce_with_logits)");
    }
    if (y.scalar_type() != at::kLong) {
      return absl::InvalidArgumentError(where + "its targets are " + std::string(c10::toString(y.scalar_type())) +
                                        ", and " + loss + " takes int64 class indices, as PyTorch's does (save "
                                        "them with targets.long())");
    }
    const std::vector<int64_t> want(output_sample_shape.begin(), output_sample_shape.end() - 1);
    const std::vector<int64_t> got(y.sizes().begin() + 1, y.sizes().end());
    if (got != want) {
      return absl::InvalidArgumentError(
          where + "each target has shape " + shape(got) + ", and the model's output of shape " +
          shape(output_sample_shape) + " per sample wants class indices of shape " + shape(want) +
          " (one per position but the classes' dimension; PyTorch refuses the others too)");
    }
    const int64_t classes = output_sample_shape.back();
    const at::Tensor flat = y.reshape({y.size(0), -1});
    const at::Tensor bad = flat.lt(0).logical_or(flat.ge(classes));
    if (!bad.any().item<bool>()) return absl::OkStatus();
    const int64_t sample = bad.any(1).nonzero()[0][0].item<int64_t>();
    const int64_t value = flat[sample].masked_select(bad[sample])[0].item<int64_t>();
    return absl::InvalidArgumentError(where + "sample " + std::to_string(sample) + " has the target " +
                                      std::to_string(value) + ", outside the model's " + std::to_string(classes) +
                                      " classes [0, " + std::to_string(classes) + ")");
  };
  if (spec.data().train_shards_size() == 0) {
    CONVEYOR_RETURN_IF_ERROR(check("data.train", spec.data().train(), train_y_));
  } else {
    for (std::size_t k = 0; k < shard_y_.size(); ++k)
      CONVEYOR_RETURN_IF_ERROR(check("data.train", spec.data().train_shards(static_cast<int>(k)), shard_y_[k]));
  }
  return check("data.test", spec.data().test(), test_y_);
}

at::Tensor Dataset::Inputs(v1::Phase phase, int64_t step, bool pinned) {
  if (train_tokens_) {
    const TokenFile& f = phase == v1::PHASE_TRAIN ? *train_tokens_ : *test_tokens_;
    return f.Gather(Indices(phase, step), /*shift=*/0, pinned);
  }
  const at::Tensor idx = Indices(phase, step);
  if (phase == v1::PHASE_TRAIN && !shard_rows_.empty()) return GatherShardRows(shard_x_, shard_rows_, idx, pinned);
  const at::Tensor& x = phase == v1::PHASE_TRAIN ? train_x_ : test_x_;
  if (x.scalar_type() != at::kByte || !scale_bytes_) return GatherRows(x, idx, x.scalar_type(), pinned);
  return GatherRows(x, idx, at::kFloat, pinned).div_(255.0);
}

at::Tensor Dataset::Labels(v1::Phase phase, int64_t step, bool pinned) {
  if (train_tokens_) {
    const TokenFile& f = phase == v1::PHASE_TRAIN ? *train_tokens_ : *test_tokens_;
    return f.Gather(Indices(phase, step), /*shift=*/1, pinned);
  }
  const at::Tensor idx = Indices(phase, step);
  if (phase == v1::PHASE_TRAIN && !shard_rows_.empty()) return GatherShardRows(shard_y_, shard_rows_, idx, pinned);
  const at::Tensor& y = phase == v1::PHASE_TRAIN ? train_y_ : test_y_;
  return GatherRows(y, idx, y.scalar_type(), pinned);
}

}  // namespace conveyor
