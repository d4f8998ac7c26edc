#include <zlib.h>

#include "torch_format/zip.h"

namespace conveyor::torch_format {

uint64_t Le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int k = n - 1; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

uint32_t Crc32(const uint8_t* p, std::size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const uInt chunk = n > (1u << 30) ? (1u << 30) : static_cast<uInt>(n);
    crc = crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

Status ReadZip(const uint8_t* p, uint64_t size, const std::string& name, std::map<std::string, ZipEntry>* out) {
  auto bad = [&](const std::string& what) { return absl::InvalidArgumentError(name + ": " + what); };
  if (size < 22) return bad("not a zip file (" + std::to_string(size) + " bytes, too short for one)");
  uint64_t eocd = UINT64_MAX;
  const uint64_t lowest = size >= 22 + 65535 ? size - 22 - 65535 : 0;
  for (uint64_t at = size - 22 + 1; at-- > lowest;) {
    if (Le(p + at, 4) == kEndSig && at + 22 + Le(p + at + 20, 2) == size) {
      eocd = at;
      break;
    }
  }
  if (eocd == UINT64_MAX) return bad("not a zip file, or a truncated one (no end of central directory record)");
  uint64_t entries = Le(p + eocd + 10, 2), cd_size = Le(p + eocd + 12, 4), cd_offset = Le(p + eocd + 16, 4);
  if (eocd >= 20 && Le(p + eocd - 20, 4) == kLocator64Sig) {
    const uint64_t end64 = Le(p + eocd - 20 + 8, 8);
    if (end64 > eocd - 20 || eocd - 20 - end64 < 56 || Le(p + end64, 4) != kEnd64Sig)
      return bad("corrupt zip64 end of central directory record");
    entries = Le(p + end64 + 32, 8);
    cd_size = Le(p + end64 + 40, 8);
    cd_offset = Le(p + end64 + 48, 8);
  }
  if (cd_offset > size || cd_size > size - cd_offset) return bad("corrupt zip central directory (past the end)");
  if (entries > cd_size / 46) return bad("corrupt zip central directory (" + std::to_string(entries) + " entries)");
  uint64_t at = cd_offset;
  const uint64_t cd_end = cd_offset + cd_size;
  for (uint64_t n = 0; n < entries; ++n) {
    if (cd_end - at < 46 || Le(p + at, 4) != kCentralSig) return bad("corrupt zip central directory entry");
    const uint64_t flags = Le(p + at + 8, 2), method = Le(p + at + 10, 2);
    const uint32_t crc = static_cast<uint32_t>(Le(p + at + 16, 4));
    uint64_t csize = Le(p + at + 20, 4), usize = Le(p + at + 24, 4);
    const uint64_t name_len = Le(p + at + 28, 2), extra_len = Le(p + at + 30, 2), comment_len = Le(p + at + 32, 2);
    uint64_t local = Le(p + at + 42, 4);
    if (cd_end - at - 46 < name_len + extra_len + comment_len) return bad("corrupt zip central directory entry");
    const std::string entry(reinterpret_cast<const char*>(p + at + 46), name_len);
    // Zip64 sizes and offset: present for each field that reads 0xFFFFFFFF.
    const uint8_t* extra = p + at + 46 + name_len;
    for (uint64_t e = 0; e + 4 <= extra_len;) {
      const uint64_t id = Le(extra + e, 2), len = Le(extra + e + 2, 2);
      if (e + 4 + len > extra_len) return bad("corrupt zip extra field in " + entry);
      if (id == 1) {
        uint64_t f = e + 4;
        auto take = [&](uint64_t* field) {
          if (*field != 0xFFFFFFFFu) return true;
          if (f + 8 > e + 4 + len) return false;
          *field = Le(extra + f, 8);
          f += 8;
          return true;
        };
        if (!take(&usize) || !take(&csize) || !take(&local)) return bad("corrupt zip64 extra field in " + entry);
      }
      e += 4 + len;
    }
    if (flags & 1) return bad(entry + " is encrypted");
    if (method != 0)
      return bad(entry + " is compressed (method " + std::to_string(method) +
                 "); torch.save stores entries uncompressed");
    if (csize != usize) return bad("corrupt zip entry " + entry + " (stored sizes differ)");
    if (local > size || size - local < 30 || Le(p + local, 4) != kLocalSig)
      return bad("corrupt zip local header of " + entry);
    const uint64_t data = local + 30 + Le(p + local + 26, 2) + Le(p + local + 28, 2);
    if (data > size || usize > size - data)
      return bad(entry + " runs past the end of the file (truncated?)");
    (*out)[entry] = ZipEntry{data, usize, crc};
    at += 46 + name_len + extra_len + comment_len;
  }
  return absl::OkStatus();
}

}  // namespace conveyor::torch_format
