#include "stage_server/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/files.h"
#include "common/sha256.h"
#include "common/logging.h"

namespace conveyor {
namespace {

constexpr char kMagic[] = "CVYCKPT1";
constexpr std::size_t kMagicBytes = 8;
constexpr std::size_t kSumBytes = 32;
constexpr uint32_t kMaxHeaderBytes = 1 << 20;

std::string StageDir(const std::string& dir, const std::string& job_id, int stage) {
  return dir + "/" + job_id + "/stage-" + std::to_string(stage);
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Chaos hook for the recovery tests: CONVEYOR_CHAOS_KILL_IN_CHECKPOINT=N kills
// this process (SIGKILL) in the middle of its N-th checkpoint write, with the
// start of the file on disk under its temporary name.
void MaybeDieMidWrite(const std::string& path, const std::string& start) {
  static int writes = 0;
  const char* env = std::getenv("CONVEYOR_CHAOS_KILL_IN_CHECKPOINT");
  if (!env || ++writes != std::atoi(env)) return;
  LOG_WARN("chaos: killing this stage in the middle of writing ", path);
  if (FILE* f = std::fopen((path + ".tmp").c_str(), "wb")) {
    std::fwrite(start.data(), 1, start.size(), f);
    std::fflush(f);
  }
  kill(getpid(), SIGKILL);
}

}  // namespace

std::string CheckpointFiles::PathFor(const std::string& job_id, int stage, int64_t step) const {
  char name[32];
  std::snprintf(name, sizeof name, "step-%012lld.ckpt", static_cast<long long>(step));
  return StageDir(dir_, job_id, stage) + "/" + name;
}

StatusOr<v1::CheckpointRecord> CheckpointFiles::Save(v1::CheckpointHeader header, const std::string& payload,
                                                     int keep) {
  if (dir_.empty())
    return absl::FailedPreconditionError("this stage has no --checkpoint-dir, so it cannot write checkpoints");
  header.set_payload_bytes(static_cast<int64_t>(payload.size()));
  // Magic, header length and header, then the payload as it is (it can be
  // gigabytes: no copy of it), then the checksum of both.
  std::string prefix(kMagic, kMagicBytes);
  const std::string head = header.SerializeAsString();
  PutU32(&prefix, static_cast<uint32_t>(head.size()));
  prefix += head;
  Sha256 sum;
  sum.Update(prefix);
  sum.Update(payload);
  const std::string digest = sum.Final();
  const std::vector<std::string_view> file{prefix, payload, digest};
  const std::string path = PathFor(header.job_id(), header.stage_index(), header.step());
  MaybeDieMidWrite(path, prefix);
  CONVEYOR_RETURN_IF_ERROR(WriteFileDurably(path, file));
  v1::CheckpointRecord record;
  record.set_step(header.step());
  record.set_path(path);
  record.set_bytes(static_cast<int64_t>(prefix.size() + payload.size() + digest.size()));
  record.set_sha256(HexString(digest));
  std::vector<int64_t> steps = Steps(header.job_id(), header.stage_index());
  for (std::size_t i = 0; i + keep < steps.size(); ++i) {
    ::unlink(PathFor(header.job_id(), header.stage_index(), steps[i]).c_str());
  }
  return record;
}

StatusOr<std::string> ParseCheckpoint(const std::string& file, const std::string& path, v1::CheckpointHeader* header) {
  if (file.size() < kMagicBytes + 4 + kSumBytes || file.compare(0, kMagicBytes, kMagic, kMagicBytes) != 0)
    return absl::DataLossError("checkpoint " + path + " is truncated or not a checkpoint");
  Sha256 sum;
  sum.Update(file.data(), file.size() - kSumBytes);
  if (sum.Final() != file.substr(file.size() - kSumBytes))
    return absl::DataLossError("checkpoint " + path + " is corrupt: its checksum does not match");
  const uint32_t head_bytes = GetU32(file.data() + kMagicBytes);
  const std::size_t body = file.size() - kMagicBytes - 4 - kSumBytes;
  if (head_bytes > kMaxHeaderBytes || head_bytes > body ||
      !header->ParseFromArray(file.data() + kMagicBytes + 4, static_cast<int>(head_bytes)))
    return absl::DataLossError("checkpoint " + path + " has a bad header");
  if (header->payload_bytes() != static_cast<int64_t>(body - head_bytes))
    return absl::DataLossError("checkpoint " + path + " is truncated: its payload has " +
                               std::to_string(body - head_bytes) + " bytes, the header says " +
                               std::to_string(header->payload_bytes()));
  return file.substr(kMagicBytes + 4 + head_bytes, body - head_bytes);
}

StatusOr<std::string> CheckpointFiles::Load(const std::string& job_id, int stage, int64_t step,
                                            v1::CheckpointHeader* header, v1::CheckpointRecord* record) const {
  if (dir_.empty())
    return absl::FailedPreconditionError("this stage has no --checkpoint-dir, so it has no checkpoints");
  const std::string path = PathFor(job_id, stage, step);
  auto file = ReadWholeFile(path);
  if (!file.ok()) {
    if (absl::IsNotFound(file.status()))
      return absl::NotFoundError("no checkpoint of step " + std::to_string(step) + " (" + path + ")");
    return file.status();
  }
  CONVEYOR_ASSIGN_OR_RETURN(std::string payload, ParseCheckpoint(*file, path, header));
  if (header->job_id() != job_id || header->stage_index() != stage || header->step() != step)
    return absl::FailedPreconditionError("checkpoint " + path + " belongs to job " + header->job_id() + " stage " +
                                         std::to_string(header->stage_index()) + " step " +
                                         std::to_string(header->step()));
  record->set_step(step);
  record->set_path(path);
  record->set_bytes(static_cast<int64_t>(file->size()));
  record->set_sha256(HexString(std::string_view(*file).substr(file->size() - kSumBytes)));  // checked above
  return payload;
}

std::vector<int64_t> CheckpointFiles::Steps(const std::string& job_id, int stage) const {
  std::vector<int64_t> steps;
  for (const std::string& name : ListDir(StageDir(dir_, job_id, stage))) {
    long long step = 0;
    char tail = 0;
    if (std::sscanf(name.c_str(), "step-%lld.ckp%c", &step, &tail) == 2 && tail == 't' &&
        name.size() == std::string("step-000000000000.ckpt").size())
      steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace conveyor
