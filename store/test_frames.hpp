// Frame builders shared by the store's unit tests (both dialects).
#pragma once

#include <string>
#include <vector>

#include "store/protocol.hpp"
#include "store/wire.hpp"

namespace ddprun::store::test {

class Frame {
 public:
  // A frame of `op` numbered in `dialect`.
  Frame(Dialect dialect, Op op)
      : bytes_(1, static_cast<char>(dialect == Dialect::kTorch1 ? torch1_opcode(op)
                                                                : torch2_opcode(op))) {}
  Frame& str(std::string_view s) { return wire::put_bytes(bytes_, s), *this; }
  Frame& i64(int64_t v) { return wire::put_i64(bytes_, v), *this; }
  Frame& u64(uint64_t v) { return wire::put_u64(bytes_, v), *this; }
  Frame& u32(uint32_t v) { return wire::put_u32(bytes_, v), *this; }
  Frame& keys(const std::vector<std::string>& ks) {
    u64(ks.size());
    for (const auto& k : ks) str(k);
    return *this;
  }
  operator std::string() const { return bytes_; }
  operator std::string_view() const { return bytes_; }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

inline std::string torch2_hello() {
  return std::string("\x00\xCE\xF7\x85\x3C", 5);
}
inline Frame v1(Op op) {
  return Frame(Dialect::kTorch1, op);
}
inline Frame v2(Op op) {
  return Frame(Dialect::kTorch2, op);
}

}  // namespace ddprun::store::test
