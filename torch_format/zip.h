// The zip archive under torch.save's files, inside torch_format/: the reader
// of its central directory (stored entries only, zip64 where present, every
// offset checked against the file's size) and the writer of stored entries
// aligned as torch.save aligns them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace conveyor::torch_format {

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50, kLocator64Sig = 0x07064b50;

// The little-endian unsigned number in p[0, n).
uint64_t Le(const uint8_t* p, int n);
// zlib's CRC-32 of n bytes, in chunks that fit its uInt.
uint32_t Crc32(const uint8_t* p, std::size_t n);

// One entry's data within the archive's bytes.
struct ZipEntry {
  uint64_t offset = 0;  // of the data
  uint64_t size = 0;
  uint32_t crc = 0;
};

// Reads the central directory of the `size` bytes at `p`: entry name ->
// stored entry. Every offset is checked against `size`; an encrypted or
// compressed entry, or a corrupt record, is INVALID_ARGUMENT starting with
// `name` (the file's).
Status ReadZip(const uint8_t* p, uint64_t size, const std::string& name, std::map<std::string, ZipEntry>* out);

// A zip file of stored (uncompressed) entries as pieces to write in order:
// headers it owns, data it points to.
class ZipWriter {
 public:
  // `force_zip64`: zip64 records on every entry, needed or not (tests use it
  // to exercise the zip64 path on small files).
  explicit ZipWriter(bool force_zip64) : force_zip64_(force_zip64) {}

  // Adds a stored entry with its data on a 64-byte boundary, as torch.save
  // writes them; `data` must stay valid until the pieces are written.
  void Add(const std::string& name, std::string_view data);
  // The central directory and its end records; then pieces() is the file.
  void Finish();
  const std::vector<std::string_view>& pieces() const { return pieces_; }

 private:
  struct Central {
    std::string name;
    uint32_t crc;
    uint64_t size, offset;
  };
  // The central directory's record of `e`; whether it needed zip64.
  bool PutCentral(const Central& e, std::string* cd) const;
  void Piece(std::string s) {
    owned_.push_back(std::move(s));
    pieces_.push_back(owned_.back());
  }
  bool force_zip64_;
  uint64_t offset_ = 0;
  std::vector<Central> central_;
  std::deque<std::string> owned_;  // stable addresses for the pieces
  std::vector<std::string_view> pieces_;
};

}  // namespace conveyor::torch_format
