// Test helpers for cares_resolver_test (cares_resolver_test.cpp, cares_resolver_dns_test.cpp):
// a fake DNS server on loopback (UDP and TCP) that answers from a table and logs the questions,
// get_addr_info() calls with their lists as text, and a fixture that writes the resolv.conf and
// hosts file a test gives.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store/sys/cares_resolver.hpp"
#include "store/sys/fd.hpp"
#include "store/sys/temp_dir.hpp"

namespace ddprun::sys::cares::test {

using std::chrono::milliseconds;

inline constexpr uint16_t kTypeA = 1;
inline constexpr uint16_t kTypeCname = 5;
inline constexpr uint16_t kTypeAaaa = 28;
inline constexpr uint16_t kClassIn = 1;
inline constexpr int kRcodeServerFailure = 2;
inline constexpr int kRcodeNameError = 3;

inline void put16(std::vector<uint8_t>& out, uint16_t v) {
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

// A name as labels, uncompressed.
inline void put_name(std::vector<uint8_t>& out, const std::string& name) {
  size_t start = 0;
  while (start < name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    out.push_back(static_cast<uint8_t>(dot - start));
    out.insert(out.end(), name.begin() + start, name.begin() + dot);
    start = dot + 1;
  }
  out.push_back(0);
}

inline void put_record(std::vector<uint8_t>& out, const std::string& owner, uint16_t type,
                       const std::vector<uint8_t>& data) {
  put_name(out, owner);
  put16(out, type);
  put16(out, kClassIn);
  put16(out, 0);
  put16(out, 60);  // TTL
  put16(out, static_cast<uint16_t>(data.size()));
  out.insert(out.end(), data.begin(), data.end());
}

// What the fake server knows about one name.
struct Entry {
  std::vector<std::string> addresses;  // "10.0.0.1", "fd00::1"
  std::string cname;                   // answered as a CNAME to this name, followed
  int rcode = 0;
  bool silent = false;     // never answers
  bool truncated = false;  // over UDP, an empty answer with TC set; over TCP, the addresses
};

inline Entry answers(std::vector<std::string> addresses) {
  Entry e;
  e.addresses = std::move(addresses);
  return e;
}

inline Entry alias_of(std::string target) {
  Entry e;
  e.cname = std::move(target);
  return e;
}

inline Entry failure(int rcode) {
  Entry e;
  e.rcode = rcode;
  return e;
}

inline Entry too_big_for_udp(std::vector<std::string> addresses) {
  Entry e = answers(std::move(addresses));
  e.truncated = true;
  return e;
}

inline Entry silence() {
  Entry e;
  e.silent = true;
  return e;
}

// A DNS server on 127.0.0.1:<ephemeral>, UDP and TCP, that answers from a table and logs the
// questions.
class FakeDns {
 public:
  explicit FakeDns(std::map<std::string, Entry> table) : table_(std::move(table)) {
    // The UDP socket takes an ephemeral port; the TCP listener needs the same number, which
    // another process (a test running beside this one) may hold, so try again until both bind.
    for (int attempt = 0; attempt < 100 && !listener_; ++attempt) bind_both();
    EXPECT_TRUE(listener_) << "no loopback port free for both UDP and TCP";
    EXPECT_EQ(::listen(listener_.get(), 4), 0);
    stop_ = make_pipe();
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeDns() {
    write_all(stop_.write.get(), "x", 1);
    thread_.join();
  }

  std::string server() const { return "127.0.0.1:" + std::to_string(port_); }

  // "name A", "name AAAA" ("name A tcp" over TCP), in the order asked.
  std::vector<std::string> questions() {
    std::lock_guard<std::mutex> lock(mu_);
    return questions_;
  }

 private:
  void bind_both() {
    sock_.reset(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(sock_.get(), reinterpret_cast<sockaddr*>(&sin), sizeof sin) != 0) return;
    socklen_t len = sizeof sin;
    ::getsockname(sock_.get(), reinterpret_cast<sockaddr*>(&sin), &len);
    port_ = ntohs(sin.sin_port);
    UniqueFd tcp(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::bind(tcp.get(), reinterpret_cast<sockaddr*>(&sin), sizeof sin) == 0) {
      listener_ = std::move(tcp);
    }
  }

  // UDP queries, TCP connections and their queries as they come (a client keeps a TCP
  // connection open while it asks over UDP too), until the destructor says stop.
  void serve() {
    std::vector<UniqueFd> conns;
    for (;;) {
      std::vector<pollfd> fds = {
          {stop_.read.get(), POLLIN, 0}, {sock_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
      for (const UniqueFd& c : conns) fds.push_back({c.get(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) <= 0 || (fds[0].revents & POLLIN)) return;
      if (fds[1].revents & POLLIN) serve_udp();
      for (size_t i = conns.size(); i-- > 0;) {
        if (fds[3 + i].revents && !serve_tcp(conns[i].get())) conns.erase(conns.begin() + i);
      }
      if (fds[2].revents & POLLIN) {
        conns.emplace_back(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      }
    }
  }

  void serve_udp() {
    uint8_t buf[512];
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    ssize_t n =
        ::recvfrom(sock_.get(), buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&peer), &peer_len);
    std::vector<uint8_t> reply = reply_to(buf, n, false);
    if (!reply.empty()) {
      ::sendto(sock_.get(), reply.data(), reply.size(), 0, reinterpret_cast<sockaddr*>(&peer),
               peer_len);
    }
  }

  // One query after its two-byte length; false once the connection is done.
  bool serve_tcp(int conn) {
    uint8_t len[2];
    uint8_t buf[512];
    if (::recv(conn, len, 2, MSG_WAITALL) != 2) return false;
    const size_t size = std::min<size_t>(sizeof buf, len[0] << 8 | len[1]);
    ssize_t n = ::recv(conn, buf, size, MSG_WAITALL);
    std::vector<uint8_t> reply = reply_to(buf, n, true);
    if (reply.empty()) return false;
    std::vector<uint8_t> out;
    put16(out, static_cast<uint16_t>(reply.size()));
    out.insert(out.end(), reply.begin(), reply.end());
    write_all(conn, reinterpret_cast<const char*>(out.data()), out.size());
    return true;
  }

  // The answer to one query (none for a silent name or garbage), the question logged.
  std::vector<uint8_t> reply_to(const uint8_t* buf, ssize_t n, bool tcp) {
    if (n < 12) return {};
    std::string name;
    size_t pos = 12;
    while (pos < static_cast<size_t>(n) && buf[pos] != 0) {
      if (!name.empty()) name += '.';
      name.append(reinterpret_cast<const char*>(buf + pos + 1), buf[pos]);
      pos += 1 + buf[pos];
    }
    if (pos + 5 > static_cast<size_t>(n)) return {};
    uint16_t type = static_cast<uint16_t>(buf[pos + 1] << 8 | buf[pos + 2]);
    {
      std::lock_guard<std::mutex> lock(mu_);
      questions_.push_back(name + (type == kTypeA ? " A" : " AAAA") + (tcp ? " tcp" : ""));
    }
    return answer(buf, pos + 5, name, type, tcp);
  }

  std::vector<uint8_t> answer(const uint8_t* query, size_t question_end, const std::string& name,
                              uint16_t type, bool tcp) {
    auto it = table_.find(name);
    Entry entry = it != table_.end() ? it->second : failure(kRcodeNameError);
    if (entry.silent) return {};
    const bool truncate = entry.truncated && !tcp;
    if (truncate) entry.addresses.clear();
    std::vector<uint8_t> body;
    uint16_t count = 0;
    std::string owner = name;
    while (!entry.cname.empty() && count < 8) {
      std::vector<uint8_t> target;
      put_name(target, entry.cname);
      put_record(body, owner, kTypeCname, target);
      ++count;
      owner = entry.cname;
      entry = table_[owner];
    }
    for (const std::string& text : entry.addresses) {
      std::vector<uint8_t> data(type == kTypeA ? 4 : 16);
      if (::inet_pton(type == kTypeA ? AF_INET : AF_INET6, text.c_str(), data.data()) != 1) {
        continue;  // the other family
      }
      put_record(body, owner, type, data);
      ++count;
    }
    std::vector<uint8_t> out(query, query + 2);  // the query's id
    put16(out, static_cast<uint16_t>(0x8180 | (truncate ? 0x0200 : 0) | entry.rcode));
    put16(out, 1);
    put16(out, count);
    put16(out, 0);
    put16(out, 0);
    out.insert(out.end(), query + 12, query + question_end);
    out.insert(out.end(), body.begin(), body.end());
    return out;
  }

  std::map<std::string, Entry> table_;
  UniqueFd sock_;
  UniqueFd listener_;
  Pipe stop_;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::vector<std::string> questions_;
  std::thread thread_;
};

inline std::string text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
    return buf;
  }
  const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(sa);
  ::inet_ntop(AF_INET6, &sin6->sin6_addr, buf, sizeof buf);
  std::string out = buf;
  if (sin6->sin6_scope_id != 0) out += "%" + std::to_string(sin6->sin6_scope_id);
  return out;
}

// One get_addr_info() call, its list as text.
struct Resolved {
  int rc = -1;
  std::vector<std::string> addresses;  // one per entry, in order
  std::string canonical;
};

inline Resolved resolve(const char* node, int family, int flags, const Options& options,
                        const char* service = nullptr) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_flags = flags;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  Resolved out;
  out.rc = get_addr_info(node, service, &hints, &res, options);
  for (addrinfo* a = res; a; a = a->ai_next) out.addresses.push_back(text(a->ai_addr));
  if (res && res->ai_canonname) out.canonical = res->ai_canonname;
  free_addr_info(res);
  return out;
}

using Texts = std::vector<std::string>;

class CaresResolverTest : public ::testing::Test {
 protected:
  // Options that read the test's resolv.conf and hosts file and ask `servers`. CARES_HOSTS is
  // set here, on the test's one thread that reads the environment.
  Options options(const std::string& servers, const std::string& resolv_conf = "",
                  const std::string& hosts = "") {
    std::ofstream(dir_.path() + "/resolv.conf") << resolv_conf;
    std::ofstream(dir_.path() + "/hosts") << hosts;
    ::setenv("CARES_HOSTS", (dir_.path() + "/hosts").c_str(), 1);
    Options o;
    o.resolv_conf = dir_.path() + "/resolv.conf";
    o.servers = servers;
    o.timeout = milliseconds(2000);
    o.hosts_from_env = true;
    return o;
  }
  TempDir dir_{"ddprun-cares-test-"};
};

}  // namespace ddprun::sys::cares::test
