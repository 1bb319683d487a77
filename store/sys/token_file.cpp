#include "store/sys/token_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "store/sys/fd.hpp"

namespace ddprun::sys {
namespace {

// A secret, not a data file: anything larger is a wrong path.
constexpr off_t kMaxTokenBytes = 64 << 10;

}  // namespace

TokenFile read_token_file(const std::string& path) {
  TokenFile out;
  const std::string what = "the token file " + path;
  // O_NONBLOCK: a FIFO (or a device) opens at once instead of waiting for a writer, and is
  // then refused as not a regular file; it changes nothing for a regular file.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0) {
    out.error = "cannot read " + what + ": " + std::strerror(errno);
    return out;
  }
  if (!S_ISREG(st.st_mode) || st.st_size > kMaxTokenBytes) {
    out.error = what + " is not a small regular file";
    return out;
  }
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      out.error = "cannot read " + what + ": " + std::strerror(errno);
      out.token.clear();
      return out;
    }
    if (n == 0) break;
    out.token.append(buf, static_cast<size_t>(n));
    if (out.token.size() > static_cast<size_t>(kMaxTokenBytes)) {
      out.error = what + " is not a small regular file";
      out.token.clear();
      return out;
    }
  }
  if (!out.token.empty() && out.token.back() == '\n') out.token.pop_back();
  if (out.token.empty()) {
    out.error = what + " is empty";
    return out;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {  // anyone who may change the secret owns the store
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    out.error = what + " can be changed by other users (mode " + mode + "); chmod 600 " + path;
    out.token.clear();
    return out;
  }
  if (st.st_mode & (S_IRGRP | S_IROTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    out.warning =
        "warning: " + what + " can be read by other users (mode " + mode + "); chmod 600 " + path;
  }
  return out;
}

}  // namespace ddprun::sys
