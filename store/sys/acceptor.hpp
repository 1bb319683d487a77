// Listening sockets, the one way: the ddpstore/agent store server and the health server both
// open their acceptor with open_listener() and judge accept errors with out_of_resources().
// Header-only over Boost.Asio.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <cerrno>
#include <string>
#include <system_error>

namespace ddprun::sys {

// Opens, binds (SO_REUSEADDR; "::" also takes IPv4 clients) and listens with `backlog`.
// Throws std::system_error whose what() is "<what>: <reason>".
inline void open_listener(boost::asio::ip::tcp::acceptor& acceptor,
                          const boost::asio::ip::tcp::endpoint& ep, int backlog,
                          const std::string& what) {
  boost::system::error_code ec;
  auto check = [&] {
    if (ec) throw std::system_error(ec, what);
  };
  acceptor.open(ep.protocol(), ec);
  check();
  acceptor.set_option(boost::asio::ip::tcp::acceptor::reuse_address(true), ec);
  check();
  if (ep.address().is_v6()) {
    acceptor.set_option(boost::asio::ip::v6_only(false), ec);
    ec.clear();
  }
  acceptor.bind(ep, ec);
  check();
  acceptor.listen(backlog, ec);
  check();
}

// An accept that failed for want of descriptors or memory (back off), not because of the one
// connection (reset before it was accepted: just accept the next).
inline bool out_of_resources(const boost::system::error_code& ec) {
  const int e = ec.value();
  return ec.category() == boost::system::system_category() &&
         (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM);
}

}  // namespace ddprun::sys
