// resolve() without blocking the caller's io_context: a name server that does not answer (5 s
// per try here, several tries) must not hold up an agent's loop, its signals included.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "store/sys/net.hpp"

namespace ddprun::sys {

// As resolve(host, port, passive = false, error). An address literal is parsed at once; a name
// is looked up on a thread of its own, and the coroutine waits for the answer on its executor.
// Cancelling the wait (a cancellation slot, awaitable_operators' ||) ends it at once with no
// addresses and *error = "name lookup cancelled"; the lookup then finishes on its thread and
// its answer is dropped. Call from a coroutine on the executor's thread.
boost::asio::awaitable<std::vector<ResolvedAddress>> async_resolve(std::string host, uint16_t port,
                                                                   std::string* error);

}  // namespace ddprun::sys
