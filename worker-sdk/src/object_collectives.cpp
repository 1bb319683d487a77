#include "ddprun/object_collectives.hpp"

#include <torch/serialize.h>

#include <cstdint>
#include <cstring>
#include <sstream>

namespace ddprun {
namespace {

template <class Value>
std::string save_to_string(const Value& value) {
  std::ostringstream out;
  torch::save(value, out);
  return out.str();
}

template <class Value>
Value load_from_string(std::string_view bytes, const char* what) {
  Value value;
  try {
    torch::load(value, bytes.data(), bytes.size());
  } catch (const c10::Error& e) {
    throw Error(std::string("object collective: cannot decode ") + what + " (" +
                std::to_string(bytes.size()) + " bytes): " + e.what_without_backtrace());
  }
  return value;
}

void put_u64(std::string& out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out.append(b, 8);
}

// Reads a little-endian u64 at `pos`; false when fewer than 8 bytes are left.
bool get_u64(std::string_view in, size_t& pos, uint64_t& v) {
  if (in.size() - pos < 8) return false;
  v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(in[pos + i])} << (8 * i);
  pos += 8;
  return true;
}

}  // namespace

std::string ObjectCodec<at::Tensor>::encode(const at::Tensor& t) {
  return save_to_string(t);
}
at::Tensor ObjectCodec<at::Tensor>::decode(std::string_view bytes) {
  return load_from_string<at::Tensor>(bytes, "a tensor");
}

std::string ObjectCodec<std::vector<at::Tensor>>::encode(const std::vector<at::Tensor>& ts) {
  return save_to_string(ts);
}
std::vector<at::Tensor> ObjectCodec<std::vector<at::Tensor>>::decode(std::string_view bytes) {
  return load_from_string<std::vector<at::Tensor>>(bytes, "a list of tensors");
}

namespace detail {

std::string pack(const std::vector<std::string>& parts) {
  size_t total = 8;
  for (const auto& p : parts) total += 8 + p.size();
  std::string out;
  out.reserve(total);
  put_u64(out, parts.size());
  for (const auto& p : parts) {
    put_u64(out, p.size());
    out += p;
  }
  return out;
}

std::vector<std::string> unpack(std::string_view packed) {
  size_t pos = 0;
  uint64_t count = 0;
  // Every part takes at least its 8-byte length, which bounds `count` before we reserve.
  if (!get_u64(packed, pos, count) || count > (packed.size() - pos) / 8) {
    throw Error("object collective: malformed object list (" + std::to_string(packed.size()) +
                " bytes)");
  }
  std::vector<std::string> parts;
  parts.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t len = 0;
    if (!get_u64(packed, pos, len) || len > packed.size() - pos) {
      throw Error("object collective: object list truncated at entry " + std::to_string(i));
    }
    parts.emplace_back(packed.substr(pos, len));
    pos += len;
  }
  if (pos != packed.size()) throw Error("object collective: trailing bytes after object list");
  return parts;
}

}  // namespace detail
}  // namespace ddprun
