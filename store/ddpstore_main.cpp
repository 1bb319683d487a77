// ddpstore: the store on its own, for multi-node jobs (so it need not live in one node's
// agent) and for anyone who wants a TCPStore server without Python.
#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <system_error>

#include "store/proxy.hpp"
#include "store/server.hpp"
#include "store/sys/console.hpp"
#include "store/sys/fd_limit.hpp"
#include "store/sys/net.hpp"
#include "store/sys/token_file.hpp"

namespace {

using ddprun::store::ProxyOptions;
using ddprun::store::ServerOptions;

// What the command line asks for: a store, or (--upstream) a proxy in front of one.
struct Args {
  ServerOptions opts;
  std::string upstream_host;  // set: run as a proxy
  uint16_t upstream_port = 0;
};

constexpr const char* kUsage =
    "usage: ddpstore [--host H] [--port P] [--token-file PATH] [--max-key-bytes N]\n"
    "                [--max-value-bytes N] [--max-keys N] [--max-output-bytes N] [--backlog N]\n"
    "       ddpstore --upstream HOST:PORT [--port P] [--token-file PATH]\n"
    "\n"
    "Serves a key-value store speaking PyTorch's c10d TCPStore protocol (torch 1.13 and 2.x\n"
    "clients, e.g. init_process_group(\"env://\") with TORCHELASTIC_USE_AGENT_STORE=True) until\n"
    "SIGTERM or SIGINT. Prints the address it bound on one line.\n"
    "\n"
    "  --host H             address or name to bind (default 0.0.0.0; \"::\" for IPv6 + IPv4)\n"
    "  --port P             port (default 29400; 0 picks a free one, printed at start)\n"
    "  --token-file PATH    serve only clients that prove they know the secret in PATH\n"
    "                       (one trailing newline ignored): ddprun agents started with\n"
    "                       --rdzv-conf token_file=PATH holding the same secret; every other\n"
    "                       connection (torch's clients too) is refused with a log line\n"
    "  --max-key-bytes N    longest key accepted (default 8192)\n"
    "  --max-value-bytes N  longest value accepted (default 8388608)\n"
    "  --max-keys N         most keys in one request (default 131072)\n"
    "  --max-output-bytes N memory for replies that clients have not read yet, beyond 64 KiB\n"
    "                       per connection, all connections together (default 268435456);\n"
    "                       a client that does not read its replies is not read from, and\n"
    "                       one reply larger than N closes its connection\n"
    "  --backlog N          listen backlog (default: /proc/sys/net/core/somaxconn)\n"
    "  --upstream HOST:PORT run as a store proxy instead (store/proxy.hpp): serve clients on\n"
    "                       127.0.0.1 (loopback clients only) and forward their requests to\n"
    "                       the store at HOST:PORT over one connection, asking once what\n"
    "                       several ask alike; --token-file is then the upstream store's\n"
    "                       secret. Exits 1 when the store goes.\n"
    "  -h, --help           this help\n"
    "\n"
    "A client sending a malformed or over-limit request is disconnected with a log line.\n"
    "Without --token-file, anyone who can reach the port can read and write the store.\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "ddpstore: %s (see ddpstore --help)\n", message.c_str());
  std::exit(2);
}

uint64_t parse_number(const std::string& flag, const std::string& text, uint64_t max) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || *end != '\0' || errno != 0 || v > max) {
    usage_error(flag + " needs a number in 0.." + std::to_string(max) + ", got '" + text + "'");
  }
  return v;
}

bool known_flag(const std::string& flag) {
  for (const char* f : {"--host", "--port", "--token-file", "--max-key-bytes", "--max-value-bytes",
                        "--max-keys", "--max-output-bytes", "--backlog", "--upstream"}) {
    if (flag == f) return true;
  }
  return false;
}

void apply_flag(Args& args, const std::string& flag, const std::string& value) {
  constexpr uint64_t kMaxSize = std::numeric_limits<uint32_t>::max();
  ServerOptions& opts = args.opts;
  if (flag == "--upstream") {
    const size_t colon = value.rfind(':');
    if (colon == std::string::npos || colon == 0) usage_error("--upstream needs HOST:PORT");
    args.upstream_host = value.substr(0, colon);
    if (args.upstream_host.size() > 2 && args.upstream_host.front() == '[') {
      args.upstream_host = args.upstream_host.substr(1, args.upstream_host.size() - 2);
    }
    args.upstream_port = static_cast<uint16_t>(parse_number(flag, value.substr(colon + 1), 65535));
  } else if (flag == "--host") {
    opts.host = value;
  } else if (flag == "--port") {
    opts.port = static_cast<uint16_t>(parse_number(flag, value, 65535));
  } else if (flag == "--token-file") {
    ddprun::sys::TokenFile file = ddprun::sys::read_token_file(value);
    if (!file.error.empty()) usage_error(file.error);
    if (!file.warning.empty()) std::fprintf(stderr, "ddpstore: %s\n", file.warning.c_str());
    opts.token = std::move(file.token);
  } else if (flag == "--max-key-bytes") {
    opts.limits.max_key = parse_number(flag, value, kMaxSize);
  } else if (flag == "--max-value-bytes") {
    opts.limits.max_value = parse_number(flag, value, kMaxSize);
  } else if (flag == "--max-keys") {
    opts.limits.max_keys = parse_number(flag, value, kMaxSize);
  } else if (flag == "--max-output-bytes") {
    opts.max_output_bytes = parse_number(flag, value, uint64_t{1} << 40);
  } else if (flag == "--backlog") {
    opts.backlog = static_cast<int>(parse_number(flag, value, 1 << 20));
  }
}

Args parse_args(int argc, char** argv) {
  Args args;
  ServerOptions& opts = args.opts;
  opts.port = 29400;
  opts.log_prefix = "[ddpstore]";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (arg.rfind("--", 0) != 0) usage_error("unexpected argument '" + arg + "'");
    std::string flag = arg.substr(0, arg.find('='));
    if (!known_flag(flag)) usage_error("unknown option '" + flag + "'");
    std::string value;
    if (flag.size() < arg.size()) {
      value = arg.substr(flag.size() + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      usage_error(flag + " needs a value");
    }
    apply_flag(args, flag, value);
  }
  // One GET of the longest value must be able to leave.
  if (opts.max_output_bytes < opts.limits.max_value + 64) {
    usage_error("--max-output-bytes " + std::to_string(opts.max_output_bytes) +
                " is less than one reply of the longest value (--max-value-bytes " +
                std::to_string(opts.limits.max_value) + " + 64)");
  }
  return args;
}

// ddpstore --upstream: a proxy on loopback until the store goes (1) or a signal (0).
int run_proxy(const Args& args) {
  ProxyOptions po;
  po.listen_port = args.opts.port;
  po.upstream_host = args.upstream_host;
  po.upstream_port = args.upstream_port;
  po.upstream.token = args.opts.token;
  po.limits = args.opts.limits;
  po.log_prefix = "[ddpstore proxy]";
  boost::asio::io_context io(1);
  std::optional<ddprun::store::StoreProxy> proxy;
  try {
    proxy.emplace(io, po);
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "ddpstore: %s\n", e.what());
    return 1;
  }
  int code = 0;
  proxy->on_upstream_lost([&](const std::string&) {
    code = 1;
    io.stop();
  });
  std::printf("[ddpstore proxy] listening on 127.0.0.1:%u for %s\n",
              static_cast<unsigned>(proxy->port()),
              ddprun::sys::endpoint_text(po.upstream_host, po.upstream_port).c_str());
  std::fflush(stdout);
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int) {
    if (!ec) proxy->close();
  });
  io.run();
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  const ServerOptions& opts = args.opts;
  std::signal(SIGPIPE, SIG_IGN);
  ddprun::sys::raise_fd_limit();  // each client holds a descriptor
  if (!args.upstream_host.empty()) return run_proxy(args);
  boost::asio::io_context io(1);
  std::optional<ddprun::store::Server> server;
  try {
    server.emplace(io, opts);
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "ddpstore: %s\n", e.what());
    return 1;
  }
  // Before the listening line, which tells scripts (and tests) the store is up.
  if (opts.token.empty() && !ddprun::sys::is_loopback(opts.host)) {
    std::fprintf(stderr,
                 "[ddpstore] warning: the rendezvous store on %s accepts any client that reaches "
                 "it; give every node --rdzv-conf token_file=PATH (and ddpstore --token-file "
                 "PATH)\n",
                 ddprun::sys::endpoint_text(opts.host, server->port()).c_str());
  }
  bool v6 = opts.host.find(':') != std::string::npos;
  std::printf("[ddpstore] listening on %s%s%s:%u\n", v6 ? "[" : "", opts.host.c_str(),
              v6 ? "]" : "", static_cast<unsigned>(server->port()));
  std::fflush(stdout);
  // Log lines to a stderr nobody reads must not stop the store (store/sys/console.hpp).
  ddprun::sys::Console::attach(io);

  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    ddprun::sys::Console::write(
        STDERR_FILENO,
        std::string("[ddpstore] stopping on ") + (signo == SIGINT ? "SIGINT\n" : "SIGTERM\n"),
        ddprun::sys::LineKind::kOwn);
    server->close();
  });
  io.run();
  ddprun::sys::Console::finish(std::chrono::seconds(1));
  return 0;
}
