// Who may connect to a round's workers' store. Its clients are unmodified PyTorch TCPStore
// clients, which cannot authenticate, so the store admits them by address
// (store::Server::set_allowed_peers): loopback, where every unbound local client comes from,
// and the round's member nodes.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <string>
#include <vector>

namespace ddprun::agent {

// 127.0.0.1 and ::1: the source address of every local client that does not bind one (the
// kernel picks 127.0.0.1 for any 127.0.0.0/8 destination), whatever MASTER_ADDR names.
std::vector<boost::asio::ip::address> loopback_peers();

// loopback_peers() plus every address of the members (advertised addresses: IP literals are
// taken as they are, names are resolved with getaddrinfo; nothing else is looked up). Names
// that do not resolve are added to *unresolved.
std::vector<boost::asio::ip::address> member_peers(const std::vector<std::string>& members,
                                                   std::vector<std::string>* unresolved);

// loopback_peers() plus the addresses of this machine's interfaces: the one-node store, when
// it has to listen on the wildcard (a host name given as --master-addr), serves this machine
// only.
std::vector<boost::asio::ip::address> this_machine_peers();

}  // namespace ddprun::agent
