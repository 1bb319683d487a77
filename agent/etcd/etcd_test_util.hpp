// The etcd tests' fixture: a real etcd (Debian's etcd-server) on free loopback ports with its
// data in a temporary directory, started once per suite, and a runner for one coroutine.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <future>
#include <thread>

#include "agent/etcd/etcd_client.hpp"
#include "agent/etcd/lease_revoke.hpp"
#include "agent/rendezvous/etcd_store.hpp"
#include "store/client.hpp"
#include "store/sys/temp_dir.hpp"

extern char** environ;

namespace ddprun::test {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using agent::EtcdStoreOptions;
using etcd::Clock;

inline uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Runs one coroutine on a fresh io_context to its end; rethrows what it threw.
template <typename T>
T run(std::function<asio::awaitable<T>(asio::io_context&)> f, std::chrono::seconds limit = 60s) {
  asio::io_context io;
  std::promise<T> result;
  asio::co_spawn(io, f(io), [&](std::exception_ptr e, T v) {
    if (e) {
      result.set_exception(e);
    } else {
      result.set_value(std::move(v));
    }
  });
  io.run_for(limit);
  auto fut = result.get_future();
  if (fut.wait_for(0s) != std::future_status::ready) ADD_FAILURE() << "coroutine did not finish";
  return fut.get();
}

class Etcd {
 public:
  Etcd() : dir_("ddprun-etcd-test-") {
    client_port_ = free_port();
    peer_port_ = free_port();
    const std::string c = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string p = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {"etcd",
                                     "--name",
                                     "t",
                                     "--data-dir",
                                     dir_.path() + "/data",
                                     "--listen-client-urls",
                                     c,
                                     "--advertise-client-urls",
                                     c,
                                     "--listen-peer-urls",
                                     p,
                                     "--initial-advertise-peer-urls",
                                     p,
                                     "--initial-cluster",
                                     "t=" + p,
                                     "--heartbeat-interval",
                                     "50",
                                     "--election-timeout",
                                     "500",
                                     "--log-level",
                                     "error"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // etcd 3.4 logs raft's progress whatever --log-level says: into a file, not the test's output.
    posix_spawn_file_actions_t files;
    ::posix_spawn_file_actions_init(&files);
    const std::string log = dir_.path() + "/etcd.log";
    ::posix_spawn_file_actions_addopen(&files, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::posix_spawn_file_actions_adddup2(&files, 1, 2);
    if (::posix_spawnp(&pid_, "etcd", &files, nullptr, argv.data(), environ) != 0) pid_ = -1;
    ::posix_spawn_file_actions_destroy(&files);
  }
  ~Etcd() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  bool started() const { return pid_ > 0; }
  uint16_t port() const { return client_port_; }
  etcd::Options options() const {
    etcd::Options o;
    o.endpoints = {{"127.0.0.1", client_port_}};
    o.attempt_timeout = 2s;
    return o;
  }
  // Waits until etcd answers a read.
  bool ready() {
    return run<bool>([this](asio::io_context& io) -> asio::awaitable<bool> {
      etcd::EtcdClient c(io.get_executor(), options());
      co_await c.range("x", "", Clock::now() + 30s);
      co_return true;
    });
  }

 private:
  sys::TempDir dir_;
  pid_t pid_ = -1;
  uint16_t client_port_ = 0, peer_port_ = 0;
};

class EtcdTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    etcd_ = new Etcd();
    ASSERT_TRUE(etcd_->started()) << "cannot start etcd: install Debian's etcd-server";
    ASSERT_TRUE(etcd_->ready());
  }
  static void TearDownTestSuite() {
    delete etcd_;
    etcd_ = nullptr;
  }
  EtcdStoreOptions store_options(const std::string& prefix) const {
    EtcdStoreOptions o;
    o.client = etcd_->options();
    o.job_prefix = prefix;
    o.op_timeout = 10s;
    o.lease_ttl = 2s;
    o.keep_alive_every = 500ms;
    return o;
  }
  inline static Etcd* etcd_ = nullptr;
};

}  // namespace ddprun::test
