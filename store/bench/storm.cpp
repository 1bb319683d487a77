#include "store/bench/storm.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "store/bench/load_conn.hpp"
#include "store/sys/fd.hpp"
#include "store/wire.hpp"

namespace ddprun::store::bench {
namespace {

enum class Kind : uint8_t { kRank, kDropInHandshake, kDropInWait };
enum class Step : uint8_t {
  kConnect,
  kHello,
  kJoin,
  kWaitAddrs,
  kGets,
  kBarrier,
  kRelease,
  kParked,
  kDone,
  kFailed
};

struct Client {
  sys::UniqueFd fd;
  uint32_t rank = 0;
  Kind kind = Kind::kRank;
  Step step = Step::kConnect;
  uint32_t want = 0;
  std::string in;
  std::string out;            // unsent request bytes (rare: the socket buffer was full)
  uint32_t armed = EPOLLOUT;  // the epoll interest set now registered
};

// Everything a storm's threads share. Request frames are built once per rank as needed.
class Storm {
 public:
  explicit Storm(const StormOptions& o) : o_(o) {
    const size_t intruders = o.drops ? o.clients / 10 : 0;
    ranks_ = o.clients - intruders;
    world_ = o.world > 0 ? o.world : ranks_;
    std::string prefix = "storm/" + o.tag + "/";
    init_key_ = prefix + "init";
    barrier_key_ = prefix + "barrier";
    done_key_ = prefix + "done";
    never_key_ = prefix + "never";
  }

  size_t ranks() const { return ranks_; }

  // Client i's role: every tenth is an intruder when drops are on (the last of each ten).
  void assign(size_t i, Client& c) const {
    if (o_.drops && i % 10 == 9 && i / 10 < o_.clients / 10) {
      c.kind = (i / 10) % 2 == 0 ? Kind::kDropInHandshake : Kind::kDropInWait;
      c.rank = UINT32_MAX;
      return;
    }
    // Ranks are dense over the non-intruders.
    size_t intruders_before = o_.drops ? std::min(i / 10, o_.clients / 10) : 0;
    c.rank = static_cast<uint32_t>(o_.rank_offset + i - intruders_before);
  }

  void run_thread(size_t t, Clock::time_point start, Clock::time_point deadline) {
    std::vector<Client> clients;
    for (size_t i = t; i < o_.clients; i += o_.threads) {
      clients.emplace_back();
      assign(i, clients.back());
      clients.back().in.reserve(64);
    }
    sys::UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
    for (size_t j = 0; j < clients.size(); ++j)
      start_connect(ep.get(), j, clients[j], t + j * o_.threads);
    size_t open = 0;
    for (Client& c : clients) open += c.step != Step::kFailed;
    std::vector<epoll_event> events(512);
    std::vector<char> buf(64 << 10);
    Clock::time_point last_connect = start, last_release = start;
    bool intruders_gone = !o_.drops;
    while (open > 0 && Clock::now() < deadline) {
      if (!intruders_gone && completed_.load(std::memory_order_relaxed) >= ranks_ / 2) {
        for (Client& c : clients) {
          if (c.step == Step::kParked) {
            vanish(c);
            --open;
          }
        }
        intruders_gone = true;
      }
      int n = ::epoll_wait(ep.get(), events.data(), static_cast<int>(events.size()), 20);
      for (int e = 0; e < n; ++e) {
        Client& c = clients[events[e].data.u64];
        if (c.step == Step::kDone || c.step == Step::kFailed) continue;
        const Step before = c.step;
        if (c.step == Step::kConnect) {
          on_connected(c);
          if (c.step != Step::kFailed) last_connect = Clock::now();
        } else if (events[e].events & EPOLLOUT && !c.out.empty()) {
          flush(c);
        } else {
          on_readable(c, buf);
        }
        if (c.step != before && (c.step == Step::kFailed || c.step == Step::kDone)) --open;
        if (c.step == Step::kDone && c.kind == Kind::kRank) last_release = Clock::now();
        if (c.step != Step::kFailed && c.step != Step::kDone)
          rearm(ep.get(), events[e].data.u64, c);
      }
    }
    tally(clients, start, last_connect, last_release);
  }

  // A thread's clients, counted into the storm's result.
  void tally(const std::vector<Client>& clients, Clock::time_point start,
             Clock::time_point last_connect, Clock::time_point last_release) {
    size_t failed = 0, completed = 0, dropped = 0;
    for (const Client& c : clients) {
      if (c.kind == Kind::kRank) {
        if (c.step == Step::kDone) {
          ++completed;
        } else {
          ++failed;
        }
      } else if (c.step == Step::kDone) {
        ++dropped;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    result_.completed += completed;
    result_.failed += failed;
    result_.dropped += dropped;
    result_.seconds =
        std::max(result_.seconds, std::chrono::duration<double>(last_release - start).count());
    result_.connect_s =
        std::max(result_.connect_s, std::chrono::duration<double>(last_connect - start).count());
  }

  StormResult result() {
    result_.ranks = ranks_;
    result_.resets = resets_.load();
    return result_;
  }

 private:
  void start_connect(int ep, size_t index, Client& c, size_t global_index) {
    c.fd.reset(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!c.fd) return fail(c, false);
    int one = 1;
    ::setsockopt(c.fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (o_.source_addresses > 1) {
      ::setsockopt(c.fd.get(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
      sockaddr_in src{};
      src.sin_family = AF_INET;
      src.sin_addr.s_addr =
          htonl(0x7F000001u + static_cast<uint32_t>(global_index % o_.source_addresses));
      ::bind(c.fd.get(), reinterpret_cast<sockaddr*>(&src), sizeof src);
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(
        o_.ports.empty() ? o_.port
                         : o_.ports[std::min(global_index / o_.per_port, o_.ports.size() - 1)]);
    ::inet_pton(AF_INET, o_.host.c_str(), &addr.sin_addr);
    int rc = ::connect(c.fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    if (rc != 0 && errno != EINPROGRESS) return fail(c, errno == ECONNREFUSED);
    epoll_event ev{};
    ev.events = EPOLLOUT;
    ev.data.u64 = index;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, c.fd.get(), &ev);
  }

  // Changes the interest set only when it changes: the generator's own syscalls are CPU the
  // server does not get on a small machine.
  void rearm(int ep, uint64_t index, Client& c) {
    const uint32_t want = c.out.empty() ? EPOLLIN : (EPOLLIN | EPOLLOUT);
    if (want == c.armed) return;
    epoll_event ev{};
    ev.events = want;
    ev.data.u64 = index;
    ::epoll_ctl(ep, EPOLL_CTL_MOD, c.fd.get(), &ev);
    c.armed = want;
  }

  void on_connected(Client& c) {
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(c.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      return fail(c, err == ECONNREFUSED || err == ECONNRESET);
    }
    if (c.kind == Kind::kDropInHandshake) {
      send(c, std::string("\x00\xCE\xF7", 3));  // the start of a VALIDATE frame, then gone
      return vanish(c);
    }
    if (o_.dialect == Dialect::kTorch2) {
      std::string hello(1, static_cast<char>(torch2_opcode(Op::kValidate)));
      wire::put_u32(hello, kValidationMagic);
      hello.push_back(static_cast<char>(torch2_opcode(Op::kPing)));
      wire::put_u32(hello, 42);
      expect(c, Step::kHello, 4);
      return send(c, hello);
    }
    join(c);
  }

  void join(Client& c) {
    if (c.kind == Kind::kDropInWait) {
      expect(c, Step::kParked, 1);
      return send(c, frames_.wait(never_key_));
    }
    expect(c, Step::kJoin, 8);
    send(c, frames_.add(init_key_, 1));
  }

  void on_readable(Client& c, std::vector<char>& buf) {
    size_t room = c.want > c.in.size() ? c.want - c.in.size() : 1;
    ssize_t r = ::recv(c.fd.get(), buf.data(), std::min(room, buf.size()), 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) return fail(c, r == 0 || errno == ECONNRESET);
    c.in.append(buf.data(), static_cast<size_t>(r));
    if (c.in.size() < c.want) return;
    advance(c);
  }

  void advance(Client& c) {
    const std::string& in = c.in;
    switch (c.step) {
      case Step::kHello:
        if (wire::load_le(in.data(), 4) != 42) return fail(c, false);
        return join(c);
      case Step::kJoin: {
        std::string req = frames_.set(addr_key(c.rank), addr_value(c.rank));
        std::vector<std::string> keys{addr_key(0)};
        uint32_t next = static_cast<uint32_t>((c.rank + 1) % world_);
        if (next != 0) keys.push_back(addr_key(next));
        req += frames_.wait(keys);
        expect(c, Step::kWaitAddrs, 1);
        return send(c, req);
      }
      case Step::kWaitAddrs: {
        if (in[0] != static_cast<char>(kStopWaiting)) return fail(c, false);
        uint32_t next = static_cast<uint32_t>((c.rank + 1) % world_);
        expect(c, Step::kGets, 2 * (8 + kValueSize));
        return send(c, frames_.get(addr_key(0)) + frames_.get(addr_key(next)));
      }
      case Step::kGets: {
        uint32_t next = static_cast<uint32_t>((c.rank + 1) % world_);
        if (in.compare(8, kValueSize, addr_value(0)) != 0 ||
            in.compare(16 + kValueSize, kValueSize, addr_value(next)) != 0) {
          return fail(c, false);
        }
        expect(c, Step::kBarrier, 8);
        return send(c, frames_.add(barrier_key_, 1));
      }
      case Step::kBarrier: {
        auto count = static_cast<size_t>(wire::load_le(in.data(), 8));
        std::string req = count == world_ ? frames_.set(done_key_, "1") : std::string();
        expect(c, Step::kRelease, 1);
        return send(c, req + frames_.wait(done_key_));
      }
      case Step::kRelease:
        if (in[0] != static_cast<char>(kStopWaiting)) return fail(c, false);
        c.step = Step::kDone;
        completed_.fetch_add(1, std::memory_order_relaxed);
        return;
      default:
        return fail(c, false);  // a reply nobody asked for (a parked WAIT never answers)
    }
  }

  void expect(Client& c, Step step, uint32_t bytes) {
    c.step = step;
    c.want = bytes;
    c.in.clear();
  }

  void send(Client& c, const std::string& bytes) {
    c.out += bytes;
    flush(c);
  }

  void flush(Client& c) {
    while (!c.out.empty()) {
      ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      if (n <= 0) return fail(c, errno == ECONNRESET || errno == EPIPE);
      c.out.erase(0, static_cast<size_t>(n));
    }
  }

  // An abrupt disconnect: SO_LINGER 0 makes close() send RST, as a killed process's does not
  // always, but as a crashed NIC or a kill mid-write can.
  void vanish(Client& c) {
    linger l{1, 0};
    ::setsockopt(c.fd.get(), SOL_SOCKET, SO_LINGER, &l, sizeof l);
    c.fd.reset();
    c.step = Step::kDone;
  }

  void fail(Client& c, bool reset) {
    if (c.step == Step::kFailed) return;
    if (reset) resets_.fetch_add(1, std::memory_order_relaxed);
    c.step = Step::kFailed;
    c.fd.reset();
  }

  static constexpr size_t kValueSize = 22;  // "r<rank>:<port-ish>", fixed width
  static std::string addr_key(uint32_t rank) { return "storm/addr/" + std::to_string(rank); }
  static std::string addr_value(uint32_t rank) {
    char v[kValueSize + 1];
    std::snprintf(v, sizeof v, "r%010u:%010u", rank, 29500u + rank);
    return std::string(v, kValueSize);
  }
  StormOptions o_;
  Frames frames_{o_.dialect};
  size_t ranks_ = 0;
  size_t world_ = 0;  // ranks of the whole job (several generators may share it)
  std::string init_key_, barrier_key_, done_key_, never_key_;
  std::atomic<size_t> completed_{0};
  std::atomic<size_t> resets_{0};
  std::mutex mu_;
  StormResult result_;
};

}  // namespace

StormResult run_storm(const StormOptions& options) {
  StormOptions o = options;
  o.threads = std::max<size_t>(1, std::min(o.threads, o.clients));
  Storm storm(o);
  auto start = Clock::now();
  auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(o.timeout_s));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < o.threads; ++t) {
    threads.emplace_back([&, t] { storm.run_thread(t, start, deadline); });
  }
  for (auto& th : threads) th.join();
  return storm.result();
}

}  // namespace ddprun::store::bench
