#include "agent/etcd/lease_revoke.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

namespace ddprun::etcd {

using json = nlohmann::json;

std::string revoke_request(const Options& o, int64_t lease) {
  json eps = json::array();
  for (const auto& e : o.endpoints) eps.push_back({{"host", e.host}, {"port", e.port}});
  return json{{"endpoints", eps}, {"tls", o.tls},       {"cacert", o.cacert},
              {"cert", o.cert},   {"key", o.key},       {"lease", std::to_string(lease)}}
      .dump();
}

bool revoke_now(const std::string& request, std::chrono::milliseconds timeout) {
  try {
    json j = json::parse(request);
    Options o;
    for (const auto& e : j.at("endpoints")) {
      o.endpoints.push_back({e.at("host").get<std::string>(), e.at("port").get<uint16_t>()});
    }
    o.tls = j.at("tls").get<bool>();
    o.cacert = j.at("cacert").get<std::string>();
    o.cert = j.at("cert").get<std::string>();
    o.key = j.at("key").get<std::string>();
    o.attempt_timeout = timeout / static_cast<int>(std::max<size_t>(o.endpoints.size(), 1));
    o.keep_alive_probes = 0;
    const int64_t lease = std::stoll(j.at("lease").get<std::string>());
    boost::asio::io_context io(1);
    EtcdClient client(io.get_executor(), o);
    bool done = false;
    boost::asio::co_spawn(
        io,
        [&]() -> boost::asio::awaitable<void> {
          co_await client.lease_revoke(lease, Clock::now() + timeout);
          done = true;
        },
        [](std::exception_ptr) {});
    io.run_for(timeout + std::chrono::milliseconds(100));
    return done;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace ddprun::etcd
