// The lookups of the static builds' resolver (cares_resolver.hpp), over c-ares: a channel of
// each call's own that reads resolv.conf (parse_resolv_options: its timeout and attempts) and
// the hosts file, run by a poll() loop over socket functions of ours (send_datagrams), and what
// it found (each address once, IPv4 first, the canonical name), or a localhost name as loopback.
// The getaddrinfo() contract around it, literals and the result list are in addr_info.cpp.
#include "store/sys/cares_resolver.hpp"

#include <ares.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "store/sys/cares_resolver_internal.hpp"

namespace ddprun::sys::cares {
namespace {

using detail::Address;
using detail::Lookup;
using detail::loopback;

// RFC 6761: "localhost" and the names under it are loopback, whatever a DNS server says.
bool in_localhost_zone(std::string name) {
  if (name.back() == '.') name.pop_back();
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return name == "localhost" || (name.size() > 10 && name.ends_with(".localhost"));
}

int capped(const std::string& word, size_t prefix, int cap) {
  return std::clamp(std::atoi(word.c_str() + prefix), 1, cap);
}

int eai_error(int ares_status) {
  switch (ares_status) {
    case ARES_ENOTFOUND:
    case ARES_ENODATA:
    case ARES_EBADNAME:
      return EAI_NONAME;
    // No server answered, or every one failed or refused: worth asking again later.
    case ARES_ETIMEOUT:
    case ARES_ECONNREFUSED:
    case ARES_ESERVFAIL:
    case ARES_EREFUSED:
    case ARES_ENOTIMP:
    case ARES_EFORMERR:
    case ARES_EBADRESP:
      return EAI_AGAIN;
    case ARES_ENOMEM:
      return EAI_MEMORY;
    default:
      return EAI_FAIL;
  }
}

struct Pending {
  bool done = false;
  int status = ARES_ECANCELLED;
  ares_addrinfo* result = nullptr;
};

void on_done(void* arg, int status, int /*timeouts*/, ares_addrinfo* result) {
  auto* pending = static_cast<Pending*>(arg);
  pending->done = true;
  pending->status = status;
  pending->result = result;
}

// Runs the channel until `pending` is done: poll() on its sockets (select() would fail past
// descriptor 1023, and ddprun raises its descriptor limit), until its next timeout.
void run_until_done(ares_channel channel, const Pending& pending) {
  while (!pending.done) {
    std::array<ares_socket_t, ARES_GETSOCK_MAXNUM> socks{};
    const int bits = ares_getsock(channel, socks.data(), ARES_GETSOCK_MAXNUM);
    std::array<pollfd, ARES_GETSOCK_MAXNUM> fds{};
    nfds_t n = 0;
    for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
      short events = (ARES_GETSOCK_READABLE(bits, i) ? POLLIN : 0) |
                     (ARES_GETSOCK_WRITABLE(bits, i) ? POLLOUT : 0);
      if (events != 0) fds[n++] = {socks[i], events, 0};
    }
    timeval tv{};
    const timeval* next = ares_timeout(channel, nullptr, &tv);
    if (n == 0 && next == nullptr) {  // nothing to wait for: cannot finish on its own
      ares_cancel(channel);
      return;
    }
    const int ms = next ? static_cast<int>(tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000) : -1;
    const int ready = ::poll(fds.data(), n, ms);
    if (ready < 0 && errno != EINTR) {
      ares_cancel(channel);
      return;
    }
    if (ready <= 0) {
      ares_process_fd(channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);  // timeouts only
      continue;
    }
    for (nfds_t i = 0; i < n && !pending.done; ++i) {
      const short got = fds[i].revents;
      if (got == 0) continue;
      const bool error = (got & (POLLERR | POLLHUP | POLLNVAL)) != 0;
      ares_process_fd(channel, (got & POLLIN) || error ? fds[i].fd : ARES_SOCKET_BAD,
                      (got & POLLOUT) || error ? fds[i].fd : ARES_SOCKET_BAD);
    }
  }
}

// The end of the CNAME chain (DNS), or the first name of the hosts file's line: the one name
// c-ares lists that no other entry has as an alias; else the name asked, with the search
// domain that found it.
std::string canonical_name(const ares_addrinfo& found, const std::string& asked) {
  std::string out = found.name ? found.name : asked;
  for (const ares_addrinfo_cname* c = found.cnames; c; c = c->next) {
    if (c->name == nullptr) continue;
    bool is_alias = false;
    for (const ares_addrinfo_cname* o = found.cnames; o && !is_alias; o = o->next) {
      is_alias = o->alias != nullptr && ::strcasecmp(o->alias, c->name) == 0;
    }
    if (!is_alias) {
      out = c->name;
      break;
    }
  }
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

int library_status() {
  static int status = ARES_ENOTINITIALIZED;
  static std::once_flag once;
  std::call_once(once, [] {
    // c-ares 1.18 keys its DNS query ids from /dev/urandom or, in a root without one (a bare
    // chroot), from rand(): seeded from the kernel, so that they differ from run to run.
    unsigned seed = 0;
    if (::getrandom(&seed, sizeof seed, 0) == sizeof seed) std::srand(seed);
    status = ares_library_init(ARES_LIB_INIT_ALL);
  });
  return status;
}

// The sockets c-ares uses, as it would open them itself (non-blocking, close-on-exec, TCP
// without Nagle), for the one change in send_datagrams().
ares_socket_t open_socket(int domain, int type, int protocol, void*) {
  const int fd = ::socket(domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, protocol);
  if (fd >= 0 && type == SOCK_STREAM) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd >= 0 ? fd : ARES_SOCKET_BAD;
}

int close_socket(ares_socket_t fd, void*) {
  return ::close(fd);
}

int connect_socket(ares_socket_t fd, const sockaddr* addr, ares_socklen_t len, void*) {
  return ::connect(fd, addr, len);
}

ares_ssize_t receive(ares_socket_t fd, void* buf, size_t len, int flags, sockaddr* from,
                     ares_socklen_t* from_len, void*) {
  return ::recvfrom(fd, buf, len, flags, from, from_len);
}

// A connected UDP socket reports a server's "port unreachable" for one datagram on its next
// call, and for both families the next call is the AAAA query's send: the send fails unsent,
// c-ares gives that query up and the A query, whose error was taken, waits out its timeout.
// Sent again, the AAAA query draws the error anew, and the next read ends both at once.
ares_ssize_t send_datagrams(ares_socket_t fd, const iovec* vec, int count, void*) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(vec);
  msg.msg_iovlen = static_cast<size_t>(count);
  ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  if (sent < 0 && errno == ECONNREFUSED) sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  return sent;
}

constexpr ares_socket_functions kSocketFunctions = {open_socket, close_socket, connect_socket,
                                                    receive, send_datagrams};

using Channel = std::unique_ptr<ares_channeldata, void (*)(ares_channel)>;

// A channel that reads `options`' files, asks their servers, and looks in the hosts file only
// for a localhost name; null and an EAI_ error if c-ares cannot make one.
Channel open_channel(const Options& options, bool local, int* error) {
  Channel channel(nullptr, ares_destroy);
  if (int status = library_status(); status != ARES_SUCCESS) {
    *error = eai_error(status);
    return channel;
  }
  std::stringstream resolv_conf;
  resolv_conf << std::ifstream(options.resolv_conf).rdbuf();
  const RetryLimits limits = parse_resolv_options(resolv_conf.str());
  std::string lookups = local ? "f" : "fb";  // the hosts file, then DNS ("b": bind)
  std::string resolv_conf_path = options.resolv_conf;
  ares_options opts{};
  opts.lookups = lookups.data();
  opts.resolvconf_path = resolv_conf_path.data();
  opts.timeout = static_cast<int>(options.timeout.value_or(limits.timeout).count());
  opts.tries = limits.attempts;
  ares_channel raw = nullptr;
  int status = ares_init_options(
      &raw, &opts, ARES_OPT_LOOKUPS | ARES_OPT_RESOLVCONF | ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES);
  if (status == ARES_SUCCESS) {
    channel.reset(raw);
    ares_set_socket_functions(raw, &kSocketFunctions, nullptr);
  }
  if (status == ARES_SUCCESS && !options.servers.empty()) {
    status = ares_set_servers_ports_csv(channel.get(), options.servers.c_str());
  }
  if (status != ARES_SUCCESS) {
    channel.reset();
    *error = eai_error(status);
  }
  return channel;
}

// What c-ares found: each address once, IPv4 first, and the canonical name.
Lookup found_addresses(const ares_addrinfo& found, const std::string& name) {
  Lookup out;
  for (const ares_addrinfo_node* n = found.nodes; n; n = n->ai_next) {
    Address a;
    a.family = n->ai_family;
    if (n->ai_family == AF_INET) {
      std::memcpy(a.bytes.data(), &reinterpret_cast<const sockaddr_in*>(n->ai_addr)->sin_addr, 4);
    } else if (n->ai_family == AF_INET6) {
      std::memcpy(a.bytes.data(), &reinterpret_cast<const sockaddr_in6*>(n->ai_addr)->sin6_addr,
                  16);
    } else {
      continue;
    }
    if (std::find(out.addresses.begin(), out.addresses.end(), a) == out.addresses.end()) {
      out.addresses.push_back(a);
    }
  }
  std::stable_sort(out.addresses.begin(), out.addresses.end(),
                   [](const Address& a, const Address& b) { return a.family < b.family; });
  out.canonical = canonical_name(found, name);
  out.error = out.addresses.empty() ? EAI_NONAME : 0;
  return out;
}

}  // namespace
namespace detail {

// The addresses of `name` (not a literal): the hosts file, then DNS.
Lookup lookup(const std::string& name, int family, const Options& options) {
  if (name.empty()) return {EAI_NONAME, {}, {}};
  const bool local = in_localhost_zone(name);
  int error = 0;
  Channel channel = open_channel(options, local, &error);
  if (!channel) return {error, {}, {}};
  // No service: c-ares would look a name up in /etc/services (NSS); the port is set later.
  // NOSORT: RFC 6724 sorting probes routes with a socket per address; ours is IPv4 first.
  ares_addrinfo_hints hints{};
  hints.ai_family = family;
  hints.ai_flags =
      ARES_AI_CANONNAME | ARES_AI_NOSORT | (options.hosts_from_env ? ARES_AI_ENVHOSTS : 0);
  // A localhost name is asked in capitals (the hosts file matches any case): c-ares 1.18's own
  // answer for a plain "localhost" the file lacks leaks a copy of the name; ours, below, does not.
  std::string asked = name;
  if (local) {
    std::transform(asked.begin(), asked.end(), asked.begin(),
                   [](unsigned char c) { return std::toupper(c); });
  }
  Pending pending;
  ares_getaddrinfo(channel.get(), asked.c_str(), nullptr, &hints, on_done, &pending);
  run_until_done(channel.get(), pending);
  std::unique_ptr<ares_addrinfo, void (*)(ares_addrinfo*)> found(pending.result, ares_freeaddrinfo);
  if (pending.status == ARES_SUCCESS && found) return found_addresses(*found, name);
  if (local && pending.status != ARES_ENOMEM) {  // a localhost name the hosts file lacks
    Lookup out;
    if (family != AF_INET6) out.addresses.push_back(loopback(AF_INET));
    if (family != AF_INET) out.addresses.push_back(loopback(AF_INET6));
    out.canonical = name;
    return out;
  }
  return {eai_error(pending.status), {}, {}};
}

}  // namespace detail

RetryLimits parse_resolv_options(std::string_view resolv_conf) {
  RetryLimits limits;
  std::istringstream in{std::string(resolv_conf)};
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string word;
    if (!(words >> word) || word != "options") continue;
    while (words >> word && word[0] != '#' && word[0] != ';') {
      if (word.starts_with("timeout:")) limits.timeout = std::chrono::seconds(capped(word, 8, 30));
      if (word.starts_with("attempts:")) limits.attempts = capped(word, 9, 5);
    }
  }
  return limits;
}

}  // namespace ddprun::sys::cares
