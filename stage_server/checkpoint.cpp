#include "stage_server/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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

std::string CopyDir(const std::string& dir, const std::string& job_id, int stage) {
  return dir + "/" + job_id + "/copy-of-stage-" + std::to_string(stage);
}

std::string StepFile(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%012lld.ckpt", static_cast<long long>(step));
  return name;
}

// Steps of the checkpoint files in `folder`, oldest first.
std::vector<int64_t> StepsIn(const std::string& folder) {
  std::vector<int64_t> steps;
  for (const std::string& name : ListDir(folder)) {
    long long step = 0;
    char tail = 0;
    if (std::sscanf(name.c_str(), "step-%lld.ckp%c", &step, &tail) == 2 && tail == 't' &&
        name.size() == std::string("step-000000000000.ckpt").size())
      steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// Job ids and stage indices come from the network: a job id that could
// leave the folder is refused.
Status CheckNames(const std::string& job_id, int stage) {
  if (job_id.empty() || job_id.find('/') != std::string::npos || job_id == "." || job_id == ".." || stage < 0)
    return absl::InvalidArgumentError("checkpoint file of job '" + job_id + "' stage " + std::to_string(stage) +
                                      ": not a job id and stage index");
  return absl::OkStatus();
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
  return StageDir(dir_, job_id, stage) + "/" + StepFile(step);
}

std::string CheckpointFiles::CopyPathFor(const std::string& job_id, int stage, int64_t step) const {
  return CopyDir(dir_, job_id, stage) + "/" + StepFile(step);
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
  return StepsIn(StageDir(dir_, job_id, stage));
}

std::vector<int64_t> CheckpointFiles::CopySteps(const std::string& job_id, int stage) const {
  return StepsIn(CopyDir(dir_, job_id, stage));
}

StatusOr<std::string> CheckpointFiles::ReadFile(const std::string& job_id, int stage, int64_t step,
                                                v1::CheckpointHeader* header, std::string* where) const {
  CONVEYOR_RETURN_IF_ERROR(CheckNames(job_id, stage));
  if (dir_.empty()) return absl::NotFoundError("this stage server has no --checkpoint-dir");
  for (const std::string& path : {PathFor(job_id, stage, step), CopyPathFor(job_id, stage, step)}) {
    auto file = ReadWholeFile(path);
    if (!file.ok()) {
      if (absl::IsNotFound(file.status())) continue;
      return file.status();
    }
    CONVEYOR_RETURN_IF_ERROR(ParseCheckpoint(*file, path, header).status());
    if (header->job_id() != job_id || header->stage_index() != stage || header->step() != step)
      return absl::FailedPreconditionError("checkpoint " + path + " belongs to job " + header->job_id() + " stage " +
                                           std::to_string(header->stage_index()) + " step " +
                                           std::to_string(header->step()));
    if (where) *where = path;
    return std::move(*file);
  }
  return absl::NotFoundError("no checkpoint of job " + job_id + " stage " + std::to_string(stage) + " step " +
                             std::to_string(step) + " under " + dir_);
}

StatusOr<v1::CheckpointFilePart> CheckpointFiles::ReadPart(const v1::CheckpointFileRequest& req) const {
  CONVEYOR_RETURN_IF_ERROR(CheckNames(req.job_id(), req.stage()));
  if (dir_.empty()) return absl::NotFoundError("this stage server has no --checkpoint-dir");
  v1::CheckpointFilePart part;
  part.set_job_id(req.job_id());
  part.set_stage(req.stage());
  part.set_step(req.step());
  for (const std::string& path : {PathFor(req.job_id(), req.stage(), req.step()),
                                  CopyPathFor(req.job_id(), req.stage(), req.step())}) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) continue;
    std::fseek(f, 0, SEEK_END);
    const int64_t total = std::ftell(f);
    part.set_total_bytes(total);
    int64_t offset = std::clamp<int64_t>(req.offset(), 0, total);
    int64_t want = req.max_bytes() > 0 ? std::min(req.max_bytes(), kCheckpointPartBytes) : kCheckpointPartBytes;
    if (req.header_only()) {  // magic, length, header: at most kMaxHeaderBytes after the first 12
      offset = 0;
      want = kMagicBytes + 4 + kMaxHeaderBytes;
    }
    std::string data(static_cast<std::size_t>(std::min(want, total - offset)), '\0');
    std::fseek(f, offset, SEEK_SET);
    const std::size_t got = std::fread(data.data(), 1, data.size(), f);
    std::fclose(f);
    data.resize(got);
    if (req.header_only()) {
      if (data.size() < kMagicBytes + 4 || data.compare(0, kMagicBytes, kMagic, kMagicBytes) != 0)
        return absl::DataLossError("checkpoint " + path + " is truncated or not a checkpoint");
      const uint32_t head_bytes = GetU32(data.data() + kMagicBytes);
      if (head_bytes > data.size() - kMagicBytes - 4 ||
          !part.mutable_header()->ParseFromArray(data.data() + kMagicBytes + 4, static_cast<int>(head_bytes)))
        return absl::DataLossError("checkpoint " + path + " has a bad header");
      return part;
    }
    part.set_offset(offset);
    part.set_data(std::move(data));
    return part;
  }
  return absl::NotFoundError("no checkpoint of job " + req.job_id() + " stage " + std::to_string(req.stage()) +
                             " step " + std::to_string(req.step()) + " under " + dir_);
}

Status CheckpointFiles::WriteCopyPart(const v1::CheckpointFilePart& part) {
  CONVEYOR_RETURN_IF_ERROR(CheckNames(part.job_id(), part.stage()));
  if (dir_.empty()) {
    return absl::FailedPreconditionError(
        "this stage server has no --checkpoint-dir, so it cannot keep copies of other stages' checkpoints (give it "
        "one, or checkpoint_copies: 0)");
  }
  const std::string path = CopyPathFor(part.job_id(), part.stage(), part.step());
  const std::string tmp = path + ".part";
  if (part.offset() == 0) CONVEYOR_RETURN_IF_ERROR(MakeDirs(CopyDir(dir_, part.job_id(), part.stage())));
  FILE* f = std::fopen(tmp.c_str(), part.offset() == 0 ? "wb" : "r+b");
  if (!f) return absl::FailedPreconditionError("cannot write " + tmp + ": " + std::strerror(errno));
  std::fseek(f, part.offset(), SEEK_SET);
  const bool written = std::fwrite(part.data().data(), 1, part.data().size(), f) == part.data().size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) return absl::ResourceExhaustedError("cannot write " + tmp + ": " + std::strerror(errno));
  if (part.offset() + static_cast<int64_t>(part.data().size()) < part.total_bytes()) return absl::OkStatus();
  CONVEYOR_ASSIGN_OR_RETURN(std::string file, ReadWholeFile(tmp));
  v1::CheckpointHeader header;
  Status parsed = ParseCheckpoint(file, tmp, &header).status();
  if (parsed.ok() && (header.job_id() != part.job_id() || header.stage_index() != part.stage() ||
                      header.step() != part.step()))
    parsed = absl::InvalidArgumentError("the copy sent as job " + part.job_id() + " stage " +
                                        std::to_string(part.stage()) + " step " + std::to_string(part.step()) +
                                        " holds job " + header.job_id() + " stage " +
                                        std::to_string(header.stage_index()) + " step " + std::to_string(header.step()));
  ::unlink(tmp.c_str());
  CONVEYOR_RETURN_IF_ERROR(parsed);
  CONVEYOR_RETURN_IF_ERROR(WriteFileDurably(path, file));
  const std::vector<int64_t> steps = StepsIn(CopyDir(dir_, part.job_id(), part.stage()));
  const std::size_t keep = static_cast<std::size_t>(std::max(2, part.keep()));
  for (std::size_t i = 0; i + keep < steps.size(); ++i)
    ::unlink(CopyPathFor(part.job_id(), part.stage(), steps[i]).c_str());
  return absl::OkStatus();
}

}  // namespace conveyor
