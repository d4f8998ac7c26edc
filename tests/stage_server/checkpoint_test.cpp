// Checkpoint files: the round trip, and every way a file can be bad is caught
// with the right status before any byte of it is used.
#include "stage_server/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "common/files.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;

v1::CheckpointFilePart part_of(const std::string& file) {
  v1::CheckpointFilePart part;
  part.set_job_id("job-7");
  part.set_stage(1);
  part.set_step(50);
  part.set_total_bytes(static_cast<int64_t>(file.size()));
  part.set_data(file);
  return part;
}

class CheckpointFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "conveyor-ckpt-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { RemoveTree(dir_); }

  static v1::CheckpointHeader Header(int64_t step, int stage = 1) {
    v1::CheckpointHeader h;
    h.set_job_id("job-7");
    h.set_stage_index(stage);
    h.set_step(step);
    v1::ChunkAssignment* c = h.add_chunks();
    c->set_index(stage);
    c->set_layer_begin(3);
    c->set_layer_end(5);
    return h;
  }

  StatusOr<std::string> Load(CheckpointFiles& files, int64_t step, int stage = 1) {
    v1::CheckpointHeader header;
    v1::CheckpointRecord record;
    return files.Load("job-7", stage, step, &header, &record);
  }

  void Rewrite(const std::string& path, const std::function<void(std::string*)>& change) {
    auto file = ReadWholeFile(path);
    ASSERT_TRUE(file.ok()) << file.status();
    change(&*file);
    ASSERT_TRUE(WriteFileDurably(path, *file).ok());
  }

  std::string dir_;
};

TEST_F(CheckpointFilesTest, RoundTripKeepsHeaderPayloadAndChecksum) {
  CheckpointFiles files(dir_);
  const std::string payload(100000, 'x');
  auto record = files.Save(Header(10), payload, 3);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->step(), 10);
  EXPECT_EQ(record->path(), files.PathFor("job-7", 1, 10));
  EXPECT_EQ(record->bytes(), static_cast<int64_t>(std::filesystem::file_size(record->path())));
  EXPECT_EQ(record->sha256().size(), 64u);
  v1::CheckpointHeader header;
  v1::CheckpointRecord loaded;
  auto back = files.Load("job-7", 1, 10, &header, &loaded);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, payload);
  EXPECT_EQ(header.chunks(0).layer_end(), 5);
  EXPECT_EQ(loaded.sha256(), record->sha256());
  EXPECT_FALSE(std::filesystem::exists(record->path() + ".tmp"));
}

TEST_F(CheckpointFilesTest, FlippedByteIsDataLoss) {
  CheckpointFiles files(dir_);
  auto record = files.Save(Header(10), std::string(4096, 'a'), 3);
  ASSERT_TRUE(record.ok());
  Rewrite(record->path(), [](std::string* f) { (*f)[f->size() / 2] ^= 0x40; });
  auto back = Load(files, 10);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(back.status().message()), HasSubstr("checksum"));
}

TEST_F(CheckpointFilesTest, TruncatedFileIsDataLoss) {
  CheckpointFiles files(dir_);
  auto record = files.Save(Header(10), std::string(4096, 'a'), 3);
  ASSERT_TRUE(record.ok());
  auto whole = ReadWholeFile(record->path());
  ASSERT_TRUE(whole.ok());
  for (std::size_t keep : {std::size_t{0}, std::size_t{5}, std::size_t{20}, whole->size() - 1}) {
    ASSERT_TRUE(WriteFileDurably(record->path(), whole->substr(0, keep)).ok());
    EXPECT_EQ(Load(files, 10).status().code(), absl::StatusCode::kDataLoss) << "kept " << keep << " bytes";
  }
}

TEST_F(CheckpointFilesTest, ValidFileUnderAnotherNameIsRefused) {
  CheckpointFiles files(dir_);
  auto record = files.Save(Header(10, /*stage=*/2), "payload", 3);
  ASSERT_TRUE(record.ok());
  std::filesystem::create_directories(std::filesystem::path(files.PathFor("job-7", 1, 10)).parent_path());
  std::filesystem::copy_file(record->path(), files.PathFor("job-7", 1, 10));
  EXPECT_EQ(Load(files, 10, 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointFilesTest, MissingIsNotFoundAndNoDirIsFailedPrecondition) {
  CheckpointFiles files(dir_);
  EXPECT_EQ(Load(files, 10).status().code(), absl::StatusCode::kNotFound);
  CheckpointFiles none("");
  EXPECT_EQ(none.Save(Header(10), "x", 3).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Load(none, 10).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointFilesTest, KeepsTheNewestAndIgnoresHalfWrittenFiles) {
  CheckpointFiles files(dir_);
  for (int64_t step : {5, 10, 15, 20}) ASSERT_TRUE(files.Save(Header(step), "p", 3).ok());
  // What a crash in the middle of a write leaves behind.
  std::ofstream(files.PathFor("job-7", 1, 25) + ".tmp") << "CVYCKPT1 half";
  EXPECT_EQ(files.Steps("job-7", 1), (std::vector<int64_t>{10, 15, 20}));
  EXPECT_EQ(Load(files, 25).status().code(), absl::StatusCode::kNotFound);
}

// A copy travels in parts to the server that keeps it: whole once the last
// part is in, checked, readable from there as the stage's own file is, and
// kept to the newest `keep`; a copy that is garbled on the way is refused.
TEST_F(CheckpointFilesTest, ACopySentInPartsIsKeptCheckedAndReadBackFromTheHolder) {
  CheckpointFiles writer(dir_ + "/writer");
  CheckpointFiles holder(dir_ + "/holder");
  const std::string payload(3 * 1000 + 17, 'p');
  std::string file;
  for (int64_t step : {10, 20, 30}) {
    auto record = writer.Save(Header(step), payload, 3);
    ASSERT_TRUE(record.ok()) << record.status();
    auto bytes = ReadWholeFile(record->path());
    ASSERT_TRUE(bytes.ok());
    file = *bytes;
    for (std::size_t offset = 0; offset < file.size(); offset += 1000) {
      v1::CheckpointFilePart part;
      part.set_job_id("job-7");
      part.set_stage(1);
      part.set_step(step);
      part.set_offset(static_cast<int64_t>(offset));
      part.set_total_bytes(static_cast<int64_t>(file.size()));
      part.set_keep(2);
      part.set_data(file.substr(offset, 1000));
      ASSERT_TRUE(holder.WriteCopyPart(part).ok());
    }
  }
  v1::CheckpointHeader header;
  std::string where;
  auto copy = holder.ReadFile("job-7", 1, 30, &header, &where);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(*copy, file);
  EXPECT_THAT(where, HasSubstr("copy-of-stage-1"));
  EXPECT_EQ(header.step(), 30);
  EXPECT_TRUE(absl::IsNotFound(holder.ReadFile("job-7", 1, 10, &header).status())) << "kept the newest 2";
  // A peer reads it in parts, or its header alone.
  v1::CheckpointFileRequest req;
  req.set_job_id("job-7");
  req.set_stage(1);
  req.set_step(30);
  req.set_header_only(true);
  auto head = holder.ReadPart(req);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->header().step(), 30);
  EXPECT_EQ(head->total_bytes(), static_cast<int64_t>(file.size()));
  req.set_header_only(false);
  req.set_offset(5);
  req.set_max_bytes(10);
  auto part = holder.ReadPart(req);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->data(), file.substr(5, 10));
  // Garbled on the way: refused, nothing kept under the step's name.
  v1::CheckpointFilePart bad;
  bad.set_job_id("job-7");
  bad.set_stage(1);
  bad.set_step(40);
  bad.set_total_bytes(static_cast<int64_t>(file.size()));
  std::string garbled = file;
  garbled[garbled.size() / 2] ^= 1;
  bad.set_data(garbled);
  EXPECT_TRUE(absl::IsDataLoss(holder.WriteCopyPart(bad)));
  EXPECT_TRUE(absl::IsNotFound(holder.ReadFile("job-7", 1, 40, &header).status()));
  // A job id from the network that would leave the folder is refused.
  bad.set_job_id("../x");
  EXPECT_TRUE(absl::IsInvalidArgument(holder.WriteCopyPart(bad)));
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckpointFiles("").WriteCopyPart(part_of(file))));
}

TEST(ParseCheckpoint, GarbageNeverCrashes) {
  v1::CheckpointHeader header;
  std::string file = "CVYCKPT1";
  for (int i = 0; i < 200; ++i) {
    file.push_back(static_cast<char>(i * 37));
    EXPECT_FALSE(ParseCheckpoint(file, "garbage", &header).ok());
  }
}

}  // namespace
}  // namespace conveyor
