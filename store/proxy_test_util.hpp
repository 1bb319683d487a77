// Fixtures of the store proxy's tests: a store with a proxy in front (Job), a TCP relay that
// can cut the proxy's link to the store (Relay), and both together (RelayedJob).
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/proxy.hpp"
#include "store/server.hpp"

namespace ddprun::store::test {

struct Job {
  explicit Job(std::string secret = "") : token(secret) {
    ServerOptions so;
    so.host = "127.0.0.1";
    so.token = secret;
    server = std::make_unique<ServerThread>(so);
    ProxyOptions po;
    po.upstream_host = "127.0.0.1";
    po.upstream_port = server->port();
    po.upstream.token = secret;
    po.upstream.connect_timeout = std::chrono::seconds(1);
    proxy = std::make_unique<ProxyThread>(po);
  }
  std::unique_ptr<Client> direct() {
    ClientOptions o;
    o.token = token;
    return Client::connect("127.0.0.1", server->port(), o);
  }
  std::unique_ptr<Client> via_proxy() { return Client::connect("127.0.0.1", proxy->port()); }
  std::string token;
  std::unique_ptr<ServerThread> server;
  std::unique_ptr<ProxyThread> proxy;
};

// A TCP relay between the proxy and the store whose connections can be cut (RST both ways) at
// any moment, as a network fault or a store host's NIC reset would.
class Relay {
 public:
  explicit Relay(uint16_t target) : target_(target) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(listener_, 16);
    thread_ = std::thread([this] { run(); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    cut();
    ::close(listener_);
  }
  uint16_t port() const { return port_; }
  void cut() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [a, b] : pairs_) {
      for (int fd : {a, b}) {
        linger l{1, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        ::close(fd);
      }
    }
    pairs_.clear();
    ++cuts_;
  }
  int cuts() const { return cuts_; }
  // While held, nothing is forwarded either way (the bytes wait in the sockets).
  void hold(bool held) { held_ = held; }

 private:
  void run() {
    std::vector<char> buf(64 << 10);
    while (!stop_) {
      if (held_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& [a, b] : pairs_) {
          fds.push_back({a, POLLIN, 0});
          fds.push_back({b, POLLIN, 0});
        }
      }
      if (::poll(fds.data(), fds.size(), 10) <= 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      if (fds[0].revents & POLLIN) {
        int in = ::accept(listener_, nullptr, nullptr);
        int out = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(target_);
        if (::connect(out, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
          pairs_.emplace_back(in, out);
        } else {
          ::close(in);
          ::close(out);
        }
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const size_t p = (i - 1) / 2;
        if (p >= pairs_.size() || pairs_[p].first < 0) continue;
        const int from = fds[i].fd;
        const int to = from == pairs_[p].first ? pairs_[p].second : pairs_[p].first;
        const ssize_t n = ::read(from, buf.data(), buf.size());
        if (n <= 0 || ::send(to, buf.data(), static_cast<size_t>(n), MSG_NOSIGNAL) != n) {
          ::close(pairs_[p].first);
          ::close(pairs_[p].second);
          pairs_[p] = {-1, -1};
        }
      }
      pairs_.erase(std::remove(pairs_.begin(), pairs_.end(), std::pair<int, int>{-1, -1}),
                   pairs_.end());
    }
  }

  uint16_t target_;
  int listener_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::pair<int, int>> pairs_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> held_{false};
  std::atomic<int> cuts_{0};
};

// A store, a relay in front of it, and a proxy whose link goes through the relay; with a
// period, a thread cuts the relay's connections that often until stop_cutting().
struct RelayedJob {
  explicit RelayedJob(std::chrono::milliseconds period = std::chrono::milliseconds(0))
      : server(loopback()), relay(server.port()), proxy(through(relay.port())) {
    if (period.count() > 0) {
      cutter = std::thread([this, period] {
        while (!stop) {
          std::this_thread::sleep_for(period);
          relay.cut();
        }
      });
    }
  }
  ~RelayedJob() { stop_cutting(); }
  void stop_cutting() {
    stop = true;
    if (cutter.joinable()) cutter.join();
  }
  static ServerOptions loopback() {
    ServerOptions o;
    o.host = "127.0.0.1";
    return o;
  }
  static ProxyOptions through(uint16_t port) {
    ProxyOptions o;
    o.upstream_host = "127.0.0.1";
    o.upstream_port = port;
    o.upstream.connect_timeout = std::chrono::seconds(10);
    return o;
  }
  ServerThread server;
  Relay relay;
  ProxyThread proxy;
  std::atomic<bool> stop{false};
  std::thread cutter;
};

}  // namespace ddprun::store::test
