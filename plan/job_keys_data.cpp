// The job keys of the data: a built-in dataset or files of tensors or tokens,
// and how they are read.
#include "plan/job_key_rows.h"

#include <yaml-cpp/yaml.h>

#include <string>

#include "plan/job_spec.h"

namespace conveyor::job_keys_internal {
namespace {

bool FileData(const S& s) { return s.data().kind() == v1::DATA_TENSORS || s.data().kind() == v1::DATA_TOKENS; }

// data.train: one path or glob pattern, or a list of shard files.
Status ReadTrainFiles(const YAML::Node& node, S* s) {
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
}

}  // namespace

// data: the dataset, its files and its sizes.
void AddDataKeys(Table& add) {
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
      .Read(ReadTrainFiles);
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
}

}  // namespace conveyor::job_keys_internal
