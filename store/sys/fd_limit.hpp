// The open-file limit. A store with thousands of clients needs far more descriptors than the
// usual soft limit of 1024, and nothing is gained by stopping below the hard limit: servers
// raise the soft limit to the hard one at start. Their children (ddprun's workers) get the
// limit they would have had without us back before exec.
#pragma once

#include <boost/system/error_code.hpp>
#include <string>

namespace ddprun::sys {

// Raises the soft RLIMIT_NOFILE to the hard one and remembers the limit as it was.
void raise_fd_limit();

// In a forked child before exec (async-signal-safe): the limit as it was before
// raise_fd_limit(). Does nothing if it was never raised.
void restore_fd_limit_in_child();

// An accept that failed for want of resources, in words that name the limit hit:
// "Too many open files: this process's open-file limit (RLIMIT_NOFILE) of 1024 is reached;
// raise it (ulimit -n, LimitNOFILE=)".
std::string accept_failure_text(const boost::system::error_code& ec);

}  // namespace ddprun::sys
