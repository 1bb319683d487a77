#include "store/sys/async_resolve.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <memory>
#include <mutex>
#include <thread>

#include "store/sys/fd.hpp"

namespace ddprun::sys {
namespace {

namespace asio = boost::asio;

// Shared by the waiting coroutine and the lookup thread; whoever lets go last closes the pipe.
// The thread never touches the executor (which may be gone by the time DNS answers): it writes
// one byte to a pipe this object owns, and the coroutine waits for the read end.
struct Lookup {
  std::mutex mu;
  std::vector<ResolvedAddress> addresses;
  std::string error;
  bool done = false;
  Pipe pipe;
};

}  // namespace

asio::awaitable<std::vector<ResolvedAddress>> async_resolve(std::string host, uint16_t port,
                                                            std::string* error) {
  if (is_address_literal(host)) co_return resolve(host, port, false, error);
  auto lookup = std::make_shared<Lookup>();
  lookup->pipe = make_pipe();
  const int watch = ::fcntl(lookup->pipe.read.get(), F_DUPFD_CLOEXEC, 3);
  if (watch < 0) co_return resolve(host, port, false, error);  // out of descriptors: block
  asio::posix::stream_descriptor ready(co_await asio::this_coro::executor, watch);
  std::thread([lookup, host, port] {
    std::string why;
    auto found = resolve(host, port, false, &why);
    {
      std::lock_guard<std::mutex> lock(lookup->mu);
      lookup->addresses = std::move(found);
      lookup->error = std::move(why);
      lookup->done = true;
    }
    const char done = 1;
    (void)!::write(lookup->pipe.write.get(), &done, 1);
  }).detach();
  // A readiness may be another descriptor's (a forked child's copy of a descriptor closed
  // meanwhile keeps that one's epoll registration): the lookup is done when its thread says so.
  for (;;) {
    auto [ec] = co_await ready.async_wait(asio::posix::stream_descriptor::wait_read,
                                          asio::as_tuple(asio::use_awaitable));
    if (ec) {
      *error = "name lookup cancelled";
      co_return std::vector<ResolvedAddress>{};
    }
    std::lock_guard<std::mutex> lock(lookup->mu);
    if (!lookup->done) continue;
    *error = lookup->error;
    co_return std::move(lookup->addresses);
  }
}

}  // namespace ddprun::sys
