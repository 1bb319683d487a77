#include "store/sys/dns_message.hpp"

#include <sys/socket.h>

#include <cstring>

namespace ddprun::sys::dns {
namespace {

constexpr size_t kHeaderSize = 12;
constexpr size_t kMaxName = 253;
constexpr int kMaxPointerHops = 32;  // more than any honest name needs; stops pointer loops

uint16_t get16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] << 8 | p[1]);
}

void put16(std::vector<uint8_t>& out, uint16_t v) {
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v & 0xff));
}

// Reads the (possibly compressed) name at *pos, advancing *pos past it in the record. Returns
// false on anything malformed.
bool read_name(const uint8_t* data, size_t size, size_t* pos, std::string* name) {
  size_t p = *pos;
  bool jumped = false;
  int hops = 0;
  name->clear();
  while (true) {
    if (p >= size) return false;
    uint8_t len = data[p];
    if ((len & 0xc0) == 0xc0) {
      if (p + 1 >= size || ++hops > kMaxPointerHops) return false;
      if (!jumped) *pos = p + 2;
      jumped = true;
      p = static_cast<size_t>((len & 0x3f) << 8 | data[p + 1]);
      continue;
    }
    if ((len & 0xc0) != 0) return false;  // the reserved label types
    if (len == 0) {
      if (!jumped) *pos = p + 1;
      return true;
    }
    if (p + 1 + len > size) return false;
    if (!name->empty()) name->push_back('.');
    name->append(reinterpret_cast<const char*>(data + p + 1), len);
    if (name->size() > kMaxName) return false;
    p += 1 + len;
  }
}

}  // namespace

bool valid_name(std::string_view name) {
  if (!name.empty() && name.back() == '.') name.remove_suffix(1);
  if (name.empty() || name.size() > kMaxName) return false;
  size_t start = 0;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    size_t len = dot - start;
    if (len == 0 || len > 63) return false;
    start = dot + 1;
  }
  return true;
}

std::vector<uint8_t> encode_query(uint16_t id, std::string_view name, uint16_t type) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderSize + name.size() + 6);
  put16(out, id);
  put16(out, 0x0100);  // a standard query, recursion desired
  put16(out, 1);       // one question
  put16(out, 0);
  put16(out, 0);
  put16(out, 0);
  if (!name.empty() && name.back() == '.') name.remove_suffix(1);
  size_t start = 0;
  while (start < name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    out.push_back(static_cast<uint8_t>(dot - start));
    out.insert(out.end(), name.begin() + start, name.begin() + dot);
    start = dot + 1;
  }
  out.push_back(0);
  put16(out, type);
  put16(out, kClassIn);
  return out;
}

std::optional<Response> decode_response(const uint8_t* data, size_t size) {
  if (size < kHeaderSize) return std::nullopt;
  Response r;
  r.id = get16(data);
  uint16_t flags = get16(data + 2);
  if ((flags & 0x8000) == 0) return std::nullopt;  // a query, not a response
  r.truncated = (flags & 0x0200) != 0;
  r.rcode = flags & 0x000f;
  uint16_t questions = get16(data + 4);
  uint16_t answers = get16(data + 6);
  size_t pos = kHeaderSize;
  std::string name;
  for (uint16_t i = 0; i < questions; ++i) {
    if (!read_name(data, size, &pos, &name) || pos + 4 > size) return std::nullopt;
    pos += 4;
  }
  for (uint16_t i = 0; i < answers; ++i) {
    if (!read_name(data, size, &pos, &name) || pos + 10 > size) {
      // A truncated response may end mid-record: keep what was complete.
      if (r.truncated) break;
      return std::nullopt;
    }
    uint16_t type = get16(data + pos);
    uint16_t cls = get16(data + pos + 2);
    uint16_t rdlength = get16(data + pos + 8);
    pos += 10;
    if (pos + rdlength > size) {
      if (r.truncated) break;
      return std::nullopt;
    }
    if (cls == kClassIn &&
        ((type == kTypeA && rdlength == 4) || (type == kTypeAaaa && rdlength == 16))) {
      Address a;
      a.family = type == kTypeA ? AF_INET : AF_INET6;
      std::memcpy(a.bytes.data(), data + pos, rdlength);
      if (r.addresses.empty()) r.owner = name;
      r.addresses.push_back(a);
    }
    pos += rdlength;
  }
  return r;
}

}  // namespace ddprun::sys::dns
