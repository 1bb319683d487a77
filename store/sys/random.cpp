#include "store/sys/random.hpp"

#include <sys/random.h>

#include <cerrno>
#include <system_error>
#include <vector>

namespace ddprun::sys {
namespace {
constexpr char kHex[] = "0123456789abcdef";
}

void random_bytes(unsigned char* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::getrandom(out + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw std::system_error(errno, std::generic_category(), "getrandom");
    got += static_cast<size_t>(r);
  }
}

std::string random_hex(size_t bytes) {
  std::vector<unsigned char> b(bytes);
  random_bytes(b.data(), b.size());
  std::string out;
  for (unsigned char c : b) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string random_suffix() {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789_";
  unsigned char bytes[8];
  random_bytes(bytes, sizeof(bytes));
  std::string out;
  for (unsigned char b : bytes) out += kChars[b % (sizeof(kChars) - 1)];
  return out;
}

std::string random_uuid() {
  unsigned char b[16];
  random_bytes(b, sizeof(b));
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);
  std::string out;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[b[i] >> 4];
    out += kHex[b[i] & 15];
  }
  return out;
}

}  // namespace ddprun::sys
