// Host names and addresses for multi-node jobs: the name this node advertises by default,
// and torchrun's is_host rule (does an endpoint name this machine?).
#pragma once

#include <string>

namespace ddprun::agent {

// The fully qualified host name (canonical name of gethostname()), like Python's
// socket.getfqdn(); the short name when it does not resolve.
std::string fq_host_name();

// Whether `host` names this machine: "localhost", a loopback address, the host name or its
// FQDN, or a name/address that resolves to an address of one of this machine's interfaces.
// May return false for aliases it cannot see (then the agent connects as a client).
bool names_this_machine(const std::string& host);

}  // namespace ddprun::agent
