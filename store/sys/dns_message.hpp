// DNS messages on the wire (RFC 1035): the one query our resolver sends (one question, A or
// AAAA, recursion desired) and the parts of a response it reads (header, address records, the
// owner name of the first one). Plain C++, no I/O, so the tests feed it hostile bytes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::sys::dns {

inline constexpr uint16_t kTypeA = 1;
inline constexpr uint16_t kTypeCname = 5;
inline constexpr uint16_t kTypeAaaa = 28;
inline constexpr uint16_t kClassIn = 1;

inline constexpr int kRcodeOk = 0;
inline constexpr int kRcodeServerFailure = 2;
inline constexpr int kRcodeNameError = 3;  // NXDOMAIN: the name does not exist

// An IPv4 (4 bytes used) or IPv6 address in network byte order.
struct Address {
  int family = 0;  // AF_INET or AF_INET6
  std::array<uint8_t, 16> bytes{};
  friend bool operator==(const Address&, const Address&) = default;
};

// Whether `name` can be sent: labels of 1..63 bytes, 253 bytes in all, no empty label except a
// trailing dot.
bool valid_name(std::string_view name);

// A query for `name` (a trailing dot is allowed) with recursion desired. `name` must be valid.
std::vector<uint8_t> encode_query(uint16_t id, std::string_view name, uint16_t type);

struct Response {
  uint16_t id = 0;
  int rcode = 0;
  bool truncated = false;
  std::vector<Address> addresses;  // A and AAAA records of class IN, in answer order
  std::string owner;               // owner name of the first address record (the canonical name)
};

// Parses a response; nullopt for anything malformed or not a response (compression loops,
// lengths past the end, a query). Records of other types are skipped.
std::optional<Response> decode_response(const uint8_t* data, size_t size);

}  // namespace ddprun::sys::dns
