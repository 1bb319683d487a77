// libFuzzer target: the frame parser on arbitrary bytes, fed in arbitrary splits, with the
// default limits and with small ones. Checks that it never crashes, never allocates beyond
// what arrived, and that every request it yields respects the limits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "store/frame_parser.hpp"

namespace {

using ddprun::store::FrameParser;
using ddprun::store::Limits;
using ddprun::store::Request;

void check(const Request& r, const Limits& limits) {
  for (const auto& k : r.keys) {
    if (k.size() > limits.max_key) std::abort();
  }
  for (const auto& v : r.values) {
    if (v.size() > limits.max_value) std::abort();
  }
  if (r.keys.size() > limits.max_keys + 1) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // Byte 0 picks the limits, byte 1 the split pattern; the rest is the stream.
  Limits limits;
  if (data[0] & 1) {
    limits.max_key = 16;
    limits.max_value = 64;
    limits.max_keys = 4;
  }
  size_t chunk = 1 + data[1] % 17;
  std::string_view stream(reinterpret_cast<const char*>(data) + 2, size - 2);
  FrameParser parser(limits);
  while (!stream.empty() && !parser.failed()) {
    std::string_view piece = stream.substr(0, chunk);
    stream.remove_prefix(piece.size());
    while (!piece.empty()) {
      size_t used = parser.feed(piece);
      if (used > piece.size()) std::abort();
      piece.remove_prefix(used);
      if (parser.failed()) {
        if (parser.error().empty() || parser.ready()) std::abort();
        break;
      }
      if (parser.ready())
        check(parser.take(), limits);
      else if (used == 0)
        std::abort();  // no progress without a request or an error
    }
  }
  return 0;
}
