// Random identifiers, from the kernel's random source (getrandom).
#pragma once

#include <cstddef>
#include <string>

namespace ddprun::sys {

// Fills `out` with random bytes; throws std::system_error if the kernel refuses.
void random_bytes(unsigned char* out, size_t n);

// `bytes` random bytes as 2 x bytes lowercase hex digits (agent ids: "3fa9c1").
std::string random_hex(size_t bytes);

// 8 random characters from [a-z0-9_], like Python's tempfile names (log directories).
std::string random_suffix();

// A random UUID (version 4) string (--standalone's run id).
std::string random_uuid();

}  // namespace ddprun::sys
