// The job's shared secret, read from a file: ddpstore --token-file PATH and the agents'
// --rdzv-conf token_file=PATH (the rendezvous store's token, see store/PROTOCOL.md "AUTH").
// A file keeps the secret out of the command line (ps, /proc/PID/cmdline) and the environment.
#pragma once

#include <string>

namespace ddprun::sys {

struct TokenFile {
  std::string token;    // the file's bytes, less one trailing newline
  std::string error;    // unreadable, empty or implausibly large: one line naming the path
  std::string warning;  // group or others may read it: one line naming the path
};

// Never throws; the caller turns `error` into its command-line error (exit 2).
TokenFile read_token_file(const std::string& path);

}  // namespace ddprun::sys
