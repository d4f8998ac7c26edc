#include "torch_format/zip.h"

namespace conveyor::torch_format {
namespace {

void Put(std::string* s, uint64_t v, int bytes) {
  for (int k = 0; k < bytes; ++k) s->push_back(static_cast<char>((v >> (8 * k)) & 0xff));
}

}  // namespace

void ZipWriter::Add(const std::string& name, std::string_view data) {
  const bool zip64 = force_zip64_ || data.size() >= 0xFFFFFFFFu || offset_ >= 0xFFFFFFFFu;
  const uint32_t crc = Crc32(reinterpret_cast<const uint8_t*>(data.data()), data.size());
  std::string header;
  Put(&header, kLocalSig, 4);
  Put(&header, zip64 ? 45 : 20, 2);  // version needed
  Put(&header, 0, 2);                // flags
  Put(&header, 0, 2);                // stored
  Put(&header, 0, 4);                // time, date
  Put(&header, crc, 4);
  Put(&header, zip64 ? 0xFFFFFFFFu : data.size(), 4);
  Put(&header, zip64 ? 0xFFFFFFFFu : data.size(), 4);
  const uint64_t fixed = 30 + name.size() + (zip64 ? 20 : 0) + 4;
  const uint64_t pad = (64 - (offset_ + fixed) % 64) % 64;  // data on a 64-byte boundary, as torch.save
  Put(&header, name.size(), 2);
  Put(&header, (zip64 ? 20 : 0) + 4 + pad, 2);
  header += name;
  if (zip64) {
    Put(&header, 1, 2);
    Put(&header, 16, 2);
    Put(&header, data.size(), 8);
    Put(&header, data.size(), 8);
  }
  Put(&header, 0x4246, 2);  // "FB": torch's padding field
  Put(&header, pad, 2);
  header.append(pad, 'Z');
  central_.push_back({name, crc, data.size(), offset_});
  offset_ += header.size() + data.size();
  Piece(std::move(header));
  pieces_.push_back(data);
}

bool ZipWriter::PutCentral(const Central& e, std::string* cd) const {
  const bool big_size = force_zip64_ || e.size >= 0xFFFFFFFFu;
  const bool big_offset = force_zip64_ || e.offset >= 0xFFFFFFFFu;
  const int extra = (big_size ? 16 : 0) + (big_offset ? 8 : 0);
  Put(cd, kCentralSig, 4);
  Put(cd, 0x0300 | 45, 2);  // made by: unix, 4.5
  Put(cd, extra ? 45 : 20, 2);
  Put(cd, 0, 2);
  Put(cd, 0, 2);
  Put(cd, 0, 4);
  Put(cd, e.crc, 4);
  Put(cd, big_size ? 0xFFFFFFFFu : e.size, 4);
  Put(cd, big_size ? 0xFFFFFFFFu : e.size, 4);
  Put(cd, e.name.size(), 2);
  Put(cd, extra ? 4 + extra : 0, 2);
  Put(cd, 0, 2);  // comment
  Put(cd, 0, 2);  // disk
  Put(cd, 0, 2);  // internal attributes
  Put(cd, 0, 4);  // external attributes
  Put(cd, big_offset ? 0xFFFFFFFFu : e.offset, 4);
  *cd += e.name;
  if (extra) {
    Put(cd, 1, 2);
    Put(cd, extra, 2);
    if (big_size) {
      Put(cd, e.size, 8);
      Put(cd, e.size, 8);
    }
    if (big_offset) Put(cd, e.offset, 8);
  }
  return extra > 0;
}

void ZipWriter::Finish() {
  std::string cd;
  const uint64_t cd_offset = offset_;
  bool any64 = force_zip64_ || central_.size() >= 0xFFFF;
  for (const auto& e : central_) any64 |= PutCentral(e, &cd);
  const uint64_t cd_size = cd.size();
  any64 |= cd_offset >= 0xFFFFFFFFu || cd_size >= 0xFFFFFFFFu;
  if (any64) {
    const uint64_t end64 = cd_offset + cd_size;
    Put(&cd, kEnd64Sig, 4);
    Put(&cd, 44, 8);
    Put(&cd, 45, 2);
    Put(&cd, 45, 2);
    Put(&cd, 0, 4);
    Put(&cd, 0, 4);
    Put(&cd, central_.size(), 8);
    Put(&cd, central_.size(), 8);
    Put(&cd, cd_size, 8);
    Put(&cd, cd_offset, 8);
    Put(&cd, kLocator64Sig, 4);
    Put(&cd, 0, 4);
    Put(&cd, end64, 8);
    Put(&cd, 1, 4);
  }
  Put(&cd, kEndSig, 4);
  Put(&cd, 0, 4);
  const uint64_t count = any64 ? 0xFFFF : central_.size();
  Put(&cd, count, 2);
  Put(&cd, count, 2);
  Put(&cd, any64 ? 0xFFFFFFFFu : cd_size, 4);
  Put(&cd, any64 ? 0xFFFFFFFFu : cd_offset, 4);
  Put(&cd, 0, 2);
  Piece(std::move(cd));
}

}  // namespace conveyor::torch_format
