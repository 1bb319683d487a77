// Little-endian encoding helpers for the TCPStore wire format (header-only, no I/O).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ddprun::store::wire {

inline uint64_t load_le(const char* p, size_t width) {
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i) v |= uint64_t(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

inline void put_le(std::string& out, uint64_t v, size_t width) {
  char bytes[8];
  for (size_t i = 0; i < width; ++i) bytes[i] = static_cast<char>(v >> (8 * i));
  out.append(bytes, width);
}

inline void put_u8(std::string& out, uint8_t v) {
  out.push_back(static_cast<char>(v));
}
inline void put_u32(std::string& out, uint32_t v) {
  put_le(out, v, 4);
}
inline void put_u64(std::string& out, uint64_t v) {
  put_le(out, v, 8);
}
inline void put_i64(std::string& out, int64_t v) {
  put_le(out, static_cast<uint64_t>(v), 8);
}
// A string/bytes field: u64 length, then the bytes.
inline void put_bytes(std::string& out, std::string_view s) {
  put_u64(out, s.size());
  out.append(s);
}

}  // namespace ddprun::store::wire
