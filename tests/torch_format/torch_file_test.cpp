// torch_format/torch_file.h: the restricted reader and the writer of torch.save's zip
// format, torch-free. Fixtures are written at test time by PyTorch itself
// (tests/model/torch_fixtures.h).
#include "torch_format/torch_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <random>

#include "tests/model/torch_fixtures.h"

namespace conveyor {
namespace {

using namespace testing_fixtures;  // NOLINT: test helpers
using Kind = PickleValue::Kind;
using TorchFileTest = TorchFixtureTest;

TEST_F(TorchFileTest, ReadsPythonStateDict) {
  auto file = TorchFile::Open(Path("sd.pt"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->archive(), "sd");  // torch.save names it after the file ("archive" for a buffer)
  EXPECT_EQ((*file)->root().kind, Kind::kDict);
  EXPECT_TRUE((*file)->root().ordered);
  auto entries = (*file)->TensorEntries();
  ASSERT_TRUE(entries.ok()) << entries.status();
  const std::vector<Expected> want = ReadExpect(Path("sd.txt"));
  ASSERT_EQ(entries->size(), want.size());
  std::map<std::string, std::string> key_of;  // name -> storage key
  for (std::size_t n = 0; n < want.size(); ++n) {
    const auto& [name, t] = (*entries)[n];
    SCOPED_TRACE(name);
    EXPECT_EQ(name, want[n].name);
    EXPECT_EQ(TorchDTypeName(t.dtype), want[n].dtype);
    EXPECT_EQ(Ints(t.shape), want[n].shape);
    EXPECT_EQ(Ints(t.strides), want[n].stride);
    EXPECT_EQ(std::to_string(t.storage_offset), want[n].offset);
    EXPECT_EQ(t.location, "cpu");
    EXPECT_FALSE(t.requires_grad);
    EXPECT_EQ(Hex((*file)->ContiguousBytes(t)), want[n].hex);
    key_of[name] = t.storage_key;
    EXPECT_EQ(t.storage_key, key_of[want[n].group]) << "shares storage with " << want[n].group;
  }
  EXPECT_EQ(key_of["view"], key_of["base"]);
  EXPECT_NE(key_of["view"], key_of["transposed"]);
}

TEST_F(TorchFileTest, ReadsPlainTensorDict) {
  auto file = TorchFile::Open(Path("td.pt"));
  ASSERT_TRUE(file.ok()) << file.status();
  const PickleValue& root = (*file)->root();
  EXPECT_EQ(root.TypeName(), "dict");
  const PickleValue* inputs = root.Find("inputs");
  const PickleValue* targets = root.Find("targets");
  ASSERT_TRUE(inputs && targets);
  ASSERT_EQ(inputs->kind, Kind::kTensor);
  EXPECT_EQ(inputs->tensor.dtype, TorchDType::kFloat32);
  EXPECT_EQ(inputs->tensor.shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(targets->tensor.dtype, TorchDType::kInt64);
  const std::vector<Expected> want = ReadExpect(Path("td.txt"));
  EXPECT_EQ(Hex((*file)->ContiguousBytes(inputs->tensor)), want[0].hex);
  EXPECT_EQ(Hex((*file)->ContiguousBytes(targets->tensor)), want[1].hex);
  EXPECT_EQ(root.Find("nothing"), nullptr);
}

TEST_F(TorchFileTest, RefusesAGlobalOutsideWeightsOnly) {
  auto file = TorchFile::Open(Path("evil.pt"));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(file.status().message());
  EXPECT_NE(message.find(Path("evil.pt") + ": data.pkl: refuses to call posix.system"), std::string::npos) << message;
  EXPECT_NE(message.find("weights_only=True"), std::string::npos) << message;
  EXPECT_NE(::access(Path("PWNED").c_str(), F_OK), 0) << "the payload ran";
}

TEST_F(TorchFileTest, RefusesTheLegacyFormat) {
  auto file = TorchFile::Open(Path("legacy.pt"));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(file.status().message().find("legacy format"), std::string::npos) << file.status();
}

TEST_F(TorchFileTest, MissingFileIsNotFound) {
  auto file = TorchFile::Open(Path("no-such.pt"));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound) << file.status();
  Spit(Path("empty.pt"), "");
  EXPECT_EQ(TorchFile::Open(Path("empty.pt")).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TorchFileTest, TruncatedFileIsANamedError) {
  const std::string bytes = Slurp(Path("sd.pt"));
  Spit(Path("cut.pt"), bytes.substr(0, bytes.size() / 2));
  auto file = TorchFile::Open(Path("cut.pt"));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(file.status().message().rfind(Path("cut.pt") + ": ", 0), 0u) << file.status();
  EXPECT_NE(file.status().message().find("truncated"), std::string::npos) << file.status();
}

// Every prefix and thousands of bit flips of the file, and of data.pkl alone
// (the zip's CRC would catch most flips there before the unpickler sees
// them): each is read or refused with INVALID_ARGUMENT, never a crash.
TEST_F(TorchFileTest, SurvivesTruncatedAndBitFlippedCopies) {
  const std::string bytes = Slurp(Path("sd.pt"));
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    auto file = TorchFile::FromBytes(bytes.substr(0, n), "cut");
    ASSERT_FALSE(file.ok()) << "a prefix of " << n << " bytes was read";
    ASSERT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
  }
  std::mt19937 rng(17);
  int refused = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string copy = bytes;
    for (int flips = 1 + round % 4; flips > 0; --flips) copy[rng() % copy.size()] ^= 1 << (rng() % 8);
    auto file = TorchFile::FromBytes(copy, "flipped");
    if (!file.ok()) {
      ++refused;
      ASSERT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
    } else if (auto entries = (*file)->TensorEntries(); entries.ok()) {
      for (const auto& [name, t] : *entries) (*file)->ContiguousBytes(t);  // every extent was checked
    }
  }
  EXPECT_GT(refused, 0);

  auto good = TorchFile::Open(Path("sd.pt"));
  ASSERT_TRUE(good.ok()) << good.status();
  std::map<std::string, ByteSpan> storages;
  for (int key = 0; key < 64; ++key)
    if (ByteSpan s = (*good)->Storage(std::to_string(key)); s.data) storages[std::to_string(key)] = s;
  const std::string pickle = Slurp(Path("sd.pt.data.pkl"));
  ASSERT_TRUE(UnpickleRestricted(pickle, storages, "data.pkl").ok());
  for (std::size_t n = 0; n < pickle.size(); ++n)
    ASSERT_FALSE(UnpickleRestricted(pickle.substr(0, n), storages, "data.pkl").ok()) << n;
  int read = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string copy = pickle;
    for (int flips = 1 + round % 3; flips > 0; --flips) copy[rng() % copy.size()] ^= 1 << (rng() % 8);
    auto value = UnpickleRestricted(copy, storages, "data.pkl");
    if (value.ok())
      ++read;
    else
      ASSERT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument) << value.status();
  }
  EXPECT_LT(read, 20000);
}

// Hand-made pickles: what the reader refuses, and why.
TEST(UnpickleRestricted, RefusesWhatWeightsOnlyRefuses) {
  const std::string storage(16, '\0');  // four float32
  const std::map<std::string, ByteSpan> storages = {
      {"0", ByteSpan{reinterpret_cast<const uint8_t*>(storage.data()), storage.size()}}};
  auto refuse = [&](const std::string& pickle, const std::string& why) {
    auto value = UnpickleRestricted(pickle, storages, "F: data.pkl");
    ASSERT_FALSE(value.ok()) << why;
    EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(value.status().message().find(why), std::string::npos) << value.status();
  };
  const std::string tensor_head =  // _rebuild_tensor_v2(('storage', FloatStorage, '0', 'cpu', 4), ...
      B("\x80\x02" "ctorch._utils\n_rebuild_tensor_v2\n((X\x07\0\0\0storagectorch\nFloatStorage\n") +
      B("X\x01\0\0\0" "0X\x03\0\0\0" "cpu");
  auto tensor = [&](const std::string& numel, const std::string& offset, const std::string& size_stride) {
    return tensor_head + numel + "tQ" + offset + size_stride + "\x89}tR.";
  };
  ASSERT_TRUE(UnpickleRestricted(tensor(B("K\x04"), B("K\x00"), B("K\x02\x85K\x02\x85")), storages, "F").ok());
  refuse(tensor(B("K\x04"), B("K\x02"), B("K\x02\x85K\x02\x85")), "reaches element 5 of a storage of 4");
  refuse(tensor(B("K\x05"), B("K\x00"), B("K\x02\x85K\x01\x85")), "has 16 bytes in the zip");
  refuse(tensor(B("K\x04"), B("K\x00"), B("K\x02\x85K\x01K\x01\x86")), "1 sizes but 2 strides");
  refuse(tensor(B("K\x04"), B("J\xff\xff\xff\xff"), B("K\x01\x85K\x01\x85")), "negative");
  refuse(B("\x80\x02" "cbuiltins\neval\nX\x01\0\0\0" "1\x85R."),
         "F: data.pkl: refuses to call builtins.eval (only what torch.load(weights_only=True) accepts)");
  refuse(B("\x80\x02" "c__main__\nNet\n)R."), "refuses to call __main__.Net");
  refuse(B("\x80\x02" "ctorch\nFloatStorage\n)R."), "refuses to call torch.FloatStorage");
  refuse(B("\x80\x02]q\x00h\x00" "a."), "nested deeper than 100");          // a list holding itself
  refuse(B("\x80\x02}]K\x01s."), "a dict key of type list");
  refuse(B("\x80\x02\x8a\x09" "123456789."), "wider than 64 bits");
  refuse(B("\x80\x02]}b."), "BUILD of a list");
  refuse(B("\x80\x02h\x05."), "memo 5 read before");
  refuse(B("\x80\x02" "a."), "stack underflow");
  refuse(B("\x80\x02\x8f."), "unsupported pickle opcode 0x8f");  // EMPTY_SET
  refuse(B("\x80\x02(X\x07\0\0\0" "storageX\x01\0\0\0" "9tQ."), "a storage id not of the form");
  refuse(B("\x80\x02K\x01K\x02."), "STOP with 2 values left");
  refuse(B("\x80\x02N"), "ends without STOP");

  // What it does read, beyond tensors.
  auto value = UnpickleRestricted(
      B("\x80\x02}(X\x01\0\0\0" "a](K\x01\x8a\x01\xff" "G?\xf8\0\0\0\0\0\0" "\x88Ne" "K\x07)u."),
      storages, "F");
  ASSERT_TRUE(value.ok()) << value.status();
  const PickleValue* a = value->Find("a");
  ASSERT_TRUE(a && a->kind == Kind::kList && a->items.size() == 5);
  EXPECT_EQ(a->items[0].i, 1);
  EXPECT_EQ(a->items[1].i, -1);
  EXPECT_EQ(a->items[2].f, 1.5);
  EXPECT_TRUE(a->items[3].b);
  EXPECT_EQ(a->items[4].kind, Kind::kNone);
  EXPECT_EQ(value->keys[1].i, 7);
  EXPECT_EQ(value->items[1].kind, Kind::kTuple);
}

std::vector<std::pair<std::string, TensorRecord>> Records(const TorchFile& file, std::vector<std::string>* keep) {
  std::vector<std::pair<std::string, TensorRecord>> out;
  auto entries = file.TensorEntries();
  keep->reserve(entries->size());
  for (const auto& [name, t] : *entries) {
    keep->push_back(file.ContiguousBytes(t));
    TensorRecord r;
    r.dtype = t.dtype;
    r.shape = t.shape;
    r.data = keep->back().data();
    r.nbytes = keep->back().size();
    out.emplace_back(name, r);
  }
  return out;
}

void WriteExpect(const std::string& path, const std::vector<std::pair<std::string, TensorRecord>>& records) {
  std::ofstream out(path);
  for (const auto& [name, r] : records)
    WriteExpectLine(out, name, TorchDTypeName(r.dtype), r.shape,
                    std::string(static_cast<const char*>(r.data), r.nbytes));
}

// C++ writes what Python wrote; torch.load(weights_only=True) reads it back
// bit for bit and load_state_dict(strict=True) takes it; so does this reader.
TEST_F(TorchFileTest, PythonLoadsWhatItWrites) {
  auto file = TorchFile::Open(Path("sd.pt"));
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> keep;
  const auto records = Records(**file, &keep);
  WriteExpect(Path("out.txt"), records);
  for (bool zip64 : {false, true}) {
    SCOPED_TRACE(zip64 ? "zip64" : "zip32");
    TorchWriteOptions options;
    options.force_zip64 = zip64;
    options.archive = zip64 ? "weights" : "archive";
    ASSERT_TRUE(WriteTorchFile(Path("out.pt"), records, options).ok());
    EXPECT_EQ(Py("check " + Quote(Path("out.pt")) + " " + Quote(Path("out.txt")) + " --model"), 0) << PyLog();
    auto back = TorchFile::Open(Path("out.pt"));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ((*back)->archive(), options.archive);
    auto entries = (*back)->TensorEntries();
    ASSERT_TRUE(entries.ok()) << entries.status();
    ASSERT_EQ(entries->size(), records.size());
    for (std::size_t n = 0; n < records.size(); ++n) {
      EXPECT_EQ((*entries)[n].first, records[n].first);
      EXPECT_EQ((*back)->ContiguousBytes((*entries)[n].second), keep[n]);
      // torch.save's alignment: every storage starts on a 64-byte boundary.
      const ByteSpan s = (*back)->Storage((*entries)[n].second.storage_key);
      EXPECT_EQ((s.data - (*back)->Storage("0").data) % 64, 0);
    }
  }
}

TEST_F(TorchFileTest, WritesAPlainDictForDataFiles) {
  auto file = TorchFile::Open(Path("td.pt"));
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> keep;
  const auto records = Records(**file, &keep);
  WriteExpect(Path("tdout.txt"), records);
  TorchWriteOptions options;
  options.ordered_dict = false;
  ASSERT_TRUE(WriteTorchFile(Path("tdout.pt"), records, options).ok());
  EXPECT_EQ(Py("check " + Quote(Path("tdout.pt")) + " " + Quote(Path("tdout.txt")) + " --plain"), 0) << PyLog();
}

// Zip64 for real: one storage over 4 GiB (writes and reads about 4.3 GB of
// disk; runs only with CONVEYOR_BIG_FILE_TEST=1).
TEST_F(TorchFileTest, Zip64EntryOver4GiB) {
  const char* big = std::getenv("CONVEYOR_BIG_FILE_TEST");
  if (!big || std::string(big) != "1") GTEST_SKIP() << "set CONVEYOR_BIG_FILE_TEST=1 to write a 4.3 GB file";
  const std::size_t n = (std::size_t{1} << 32) + 100;
  void* mem = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* bytes = static_cast<uint8_t*>(mem);
  bytes[0] = 1;
  bytes[std::size_t{1} << 32] = 3;
  bytes[n - 1] = 2;
  TensorRecord r;
  r.dtype = TorchDType::kUInt8;
  r.shape = {static_cast<int64_t>(n)};
  r.data = bytes;
  r.nbytes = n;
  const float small[2] = {1, 2};
  TensorRecord after;  // its local header lies past 4 GiB: a zip64 offset
  after.shape = {2};
  after.data = small;
  after.nbytes = sizeof small;
  const Status st = WriteStateDict(Path("big.pt"), {{"big", r}, {"after", after}});
  ::munmap(mem, n);
  ASSERT_TRUE(st.ok()) << st;
  {
    auto file = TorchFile::Open(Path("big.pt"));
    ASSERT_TRUE(file.ok()) << file.status();
    auto entries = (*file)->TensorEntries();
    ASSERT_TRUE(entries.ok()) << entries.status();
    const ByteSpan s = (*file)->Storage((*entries)[0].second.storage_key);
    ASSERT_EQ(s.size, n);
    EXPECT_EQ(s.data[0], 1);
    EXPECT_EQ(s.data[std::size_t{1} << 32], 3);
    EXPECT_EQ(s.data[n - 1], 2);
    EXPECT_EQ((*file)->ContiguousBytes((*entries)[1].second), std::string(reinterpret_cast<const char*>(small), 8));
  }
  EXPECT_EQ(Py("check-big " + Quote(Path("big.pt")) + " " + std::to_string(n)), 0) << PyLog();
  ::unlink(Path("big.pt").c_str());
}

TEST(WriteTorchFile, RefusesAViewPastItsBytes) {
  const float data[4] = {1, 2, 3, 4};
  TensorRecord r;
  r.shape = {2, 3};
  r.data = data;
  r.nbytes = sizeof data;
  const Status st = WriteStateDict("/tmp/never-written.pt", {{"w", r}});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'w'"), std::string::npos) << st;
  EXPECT_NE(::access("/tmp/never-written.pt", F_OK), 0);
}

// Without Python: strides kept, empty dicts, every dtype.
TEST(WriteTorchFile, ReadsBackItsOwnFiles) {
  std::string tmpl = ::testing::TempDir() + "/torch_file_rt.XXXXXX";
  const std::string dir = ::mkdtemp(tmpl.data());
  const std::string path = dir + "/rt.pt";
  ASSERT_TRUE(WriteStateDict(path, std::vector<std::pair<std::string, TensorRecord>>{}).ok());
  auto empty = TorchFile::Open(path);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty.value()->root().ordered);
  EXPECT_TRUE(empty.value()->root().keys.empty());

  const std::vector<TorchDType> all = {TorchDType::kFloat32, TorchDType::kFloat64, TorchDType::kFloat16,
                                       TorchDType::kBFloat16, TorchDType::kInt64,  TorchDType::kInt32,
                                       TorchDType::kInt16,   TorchDType::kInt8,    TorchDType::kUInt8,
                                       TorchDType::kBool};
  std::vector<std::string> bytes;
  std::vector<std::pair<std::string, TensorRecord>> records;
  bytes.reserve(all.size());
  for (TorchDType dtype : all) {
    std::string b(6 * TorchDTypeSize(dtype), '\0');
    for (std::size_t k = 0; k < b.size(); ++k) b[k] = static_cast<char>(dtype == TorchDType::kBool ? k % 2 : k * 7);
    bytes.push_back(b);
    TensorRecord r;
    r.dtype = dtype;
    r.shape = {3, 2};
    r.strides = {1, 3};  // a transpose, kept as is
    r.data = bytes.back().data();
    r.nbytes = b.size();
    r.requires_grad = dtype == TorchDType::kFloat32;
    records.emplace_back(TorchDTypeName(dtype), r);
  }
  ASSERT_TRUE(WriteStateDict(path, records).ok());
  auto file = TorchFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto entries = (*file)->TensorEntries();
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), all.size());
  for (std::size_t n = 0; n < all.size(); ++n) {
    const TensorRef& t = (*entries)[n].second;
    EXPECT_EQ((*entries)[n].first, TorchDTypeName(all[n]));
    EXPECT_EQ(t.dtype, all[n]);
    EXPECT_EQ(t.strides, (std::vector<int64_t>{1, 3}));
    EXPECT_FALSE(t.is_contiguous());
    EXPECT_EQ(t.requires_grad, all[n] == TorchDType::kFloat32);
    const ByteSpan s = (*file)->Storage(t.storage_key);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(s.data), s.size), bytes[n]);
  }
  if (std::system(("rm -rf " + Quote(dir)).c_str()) != 0) ADD_FAILURE() << "cannot remove " << dir;
}

// A NumPy .npy file given as data is named as such, with the torch.save call
// that writes what Conveyor reads (it said "not a zip file").
TEST(TorchFile, ANumpyFileIsNamedWithTheFix) {
  std::string npy("\x93NUMPY\x01\x00", 8);
  npy += "v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n";
  npy += std::string(8, '\0');
  auto file = TorchFile::FromBytes(npy, "train.npy");
  ASSERT_FALSE(file.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(file.status())) << file.status();
  EXPECT_THAT(std::string(file.status().message()), ::testing::HasSubstr("train.npy: a NumPy .npy file"));
  EXPECT_THAT(std::string(file.status().message()), ::testing::HasSubstr("torch.from_numpy(X)"));
}

}  // namespace
}  // namespace conveyor
