#include "transport/grpc/chunk_codec.h"

#include <cstring>

#include "common/wire.h"

namespace conveyor {
namespace {

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// Reads across the message's spans.
class Reader {
 public:
  explicit Reader(const std::vector<Span>& spans) : spans_(spans) { SkipEmpty(); }
  bool done() const { return span_ >= spans_.size(); }

  bool Byte(uint8_t* b) {
    if (done()) return false;
    *b = static_cast<uint8_t>(spans_[span_].first[pos_]);
    Advance(1);
    return true;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  // The next n bytes as pieces of the spans, without a copy.
  bool Take(uint64_t n, std::vector<Span>* out) {
    while (n > 0) {
      if (done()) return false;
      const std::size_t here = std::min<uint64_t>(n, spans_[span_].second - pos_);
      if (out) out->emplace_back(spans_[span_].first + pos_, here);
      Advance(here);
      n -= here;
    }
    return true;
  }
  bool Copy(uint64_t n, std::string* out) {
    std::vector<Span> pieces;
    if (!Take(n, &pieces)) return false;
    out->clear();
    for (const Span& p : pieces) out->append(p.first, p.second);
    return true;
  }

 private:
  void Advance(std::size_t n) {
    pos_ += n;
    if (pos_ == spans_[span_].second) {
      ++span_;
      pos_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (span_ < spans_.size() && spans_[span_].second == 0) ++span_;
  }
  const std::vector<Span>& spans_;
  std::size_t span_ = 0, pos_ = 0;
};

Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError("malformed tensor chunk: " + what);
}

}  // namespace

std::string EncodeChunkPrefix(const v1::TensorFrame* header, int64_t offset, bool last, int64_t data_bytes) {
  std::string out;
  if (header) {
    const std::string h = header->SerializeAsString();
    out.push_back(0x0a);  // field 1, length-delimited
    PutVarint(h.size(), &out);
    out += h;
  }
  if (offset != 0) {
    out.push_back(0x10);  // field 2, varint
    PutVarint(static_cast<uint64_t>(offset), &out);
  }
  if (last) {
    out.push_back(0x20);  // field 4, varint
    out.push_back(1);
  }
  if (data_bytes > 0) {
    out.push_back(0x1a);  // field 3, length-delimited
    PutVarint(static_cast<uint64_t>(data_bytes), &out);
  }
  return out;
}

StatusOr<ChunkView> ParseChunk(const std::vector<Span>& spans) {
  ChunkView c;
  Reader r(spans);
  bool has_data = false;
  while (!r.done()) {
    uint64_t tag;
    if (!r.Varint(&tag)) return Malformed("truncated field tag");
    const uint64_t field = tag >> 3, type = tag & 7;
    uint64_t v = 0;
    if (field == 1 && type == 2) {
      if (!r.Varint(&v)) return Malformed("truncated header length");
      if (v > (1u << 20)) return Malformed("header of " + std::to_string(v) + " bytes");
      std::string bytes;
      if (!r.Copy(v, &bytes)) return Malformed("truncated header");
      if (!c.header.ParseFromString(bytes)) return Malformed("header does not parse");
      c.has_header = true;
    } else if (field == 2 && type == 0) {
      if (!r.Varint(&v)) return Malformed("truncated offset");
      c.offset = static_cast<int64_t>(v);
      if (c.offset < 0) return Malformed("negative offset");
    } else if (field == 4 && type == 0) {
      if (!r.Varint(&v)) return Malformed("truncated last flag");
      c.last = v != 0;
    } else if (field == 3 && type == 2) {
      if (has_data) return Malformed("data twice");
      has_data = true;
      if (!r.Varint(&v)) return Malformed("truncated data length");
      if (v > static_cast<uint64_t>(kMaxChunkBytes)) {
        return absl::ResourceExhaustedError("a tensor chunk of " + std::to_string(v) + " bytes is over the limit of " +
                                            std::to_string(kMaxChunkBytes));
      }
      c.data_bytes = static_cast<int64_t>(v);
      if (!r.Take(v, &c.data)) return Malformed("truncated data");
    } else if (field == 0) {
      return Malformed("field 0");
    } else if (type == 0) {  // unknown fields are skipped, as protobuf does
      if (!r.Varint(&v)) return Malformed("truncated field");
    } else if (type == 1 || type == 5) {
      if (!r.Take(type == 1 ? 8 : 4, nullptr)) return Malformed("truncated field");
    } else if (type == 2) {
      if (!r.Varint(&v) || !r.Take(v, nullptr)) return Malformed("truncated field");
    } else {
      return Malformed("wire type " + std::to_string(type));
    }
  }
  return c;
}

StatusOr<int64_t> TensorBytes(const v1::Tensor& t) {
  const int64_t size = DTypeSize(t.dtype());
  if (size == 0) return absl::InvalidArgumentError("tensor of " + DTypeName(t.dtype()));
  if (t.shape_size() > 16) return absl::InvalidArgumentError("tensor of " + std::to_string(t.shape_size()) + " dimensions");
  int64_t bytes = size;
  for (int64_t d : t.shape()) {
    if (d < 0) return absl::InvalidArgumentError("tensor with a negative dimension");
    if (d > 0 && bytes > kMaxFrameBytes / d) {
      return absl::ResourceExhaustedError("a tensor of shape " +
                                          ShapeString(std::vector<int64_t>(t.shape().begin(), t.shape().end())) +
                                          " is over the limit of " + std::to_string(kMaxFrameBytes) + " bytes");
    }
    bytes *= d;
  }
  return bytes;
}

Status ChunkAssembler::Accept(const ChunkView& c) {
  begins_ = completes_ = false;
  if (!in_frame_) {
    if (!c.has_header) return Malformed("a frame starts without its header");
    header_ = c.header;
    if (header_.carrier() == v1::CARRIER_NCCL) {
      total_ = 0;  // the bytes come over NCCL
    } else {
      CONVEYOR_ASSIGN_OR_RETURN(total_, TensorBytes(header_.tensor()));
    }
    received_ = 0;
    in_frame_ = begins_ = true;
  } else if (c.has_header) {
    return Malformed("a header in the middle of a frame");
  }
  if (c.offset != received_) {
    return Malformed("offset " + std::to_string(c.offset) + " where " + std::to_string(received_) + " was next");
  }
  if (c.data_bytes > total_ - received_) {
    return Malformed("bytes [" + std::to_string(c.offset) + ", " + std::to_string(c.offset + c.data_bytes) +
                     ") past the frame's " + std::to_string(total_));
  }
  received_ += c.data_bytes;
  if (c.last) {
    if (received_ != total_) {
      return Malformed("the frame ended after " + std::to_string(received_) + " of its " + std::to_string(total_) +
                       " bytes");
    }
    in_frame_ = false;
    completes_ = true;
  }
  return absl::OkStatus();
}

}  // namespace conveyor
