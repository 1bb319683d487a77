// What ddprun's guardian needs to revoke an agent's etcd lease after the agent died: the
// endpoints, the TLS files and the lease id, as one line of text (JSON) sent to the guardian
// while the agent runs. An agent that is killed cannot revoke its own lease; without this the
// other nodes would notice its death only when the lease expires (its TTL, 15 s by default).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "agent/etcd/etcd_client.hpp"

namespace ddprun::etcd {

std::string revoke_request(const Options& options, int64_t lease);

// Revokes the lease a revoke_request() names, trying each member once, within `timeout`.
// Blocking (its own io_context): for the guardian, a single-threaded process. Returns whether
// etcd confirmed; never throws.
bool revoke_now(const std::string& request, std::chrono::milliseconds timeout);

}  // namespace ddprun::etcd
