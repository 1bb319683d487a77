// etcd's JSON gateway as ddprun reads and writes it: int64 as decimal strings, bytes as base64,
// defaults omitted; and its error replies, sorted into those worth another try (on the next
// member, or later), authentication failures, and errors about the request itself. Private to
// agent/etcd.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "agent/etcd/etcd_client.hpp"

namespace ddprun::etcd::detail {

using json = nlohmann::json;

// The field `name` of `j` (0 or empty when absent or null).
int64_t i64(const json& j, const char* name);
std::string bytes(const json& j, const char* name);

KeyValue kv_from(const json& j);
json op_json(const Op& op);
json compare_json(const Compare& c);

// The gateway's error body: {"error": "...", "code": N, "message": "..."}.
struct ErrorReply {
  int code = 0;
  std::string message;
};

// The error in `body` (a body that is not JSON: its first 200 bytes as the message).
ErrorReply error_of(const std::string& body);

// Whether another member (or the same one a little later) may answer differently.
bool retryable(unsigned status, const ErrorReply& e);

// Whether etcd refused the request for lack of authentication or permission.
bool auth_failure(unsigned status, const ErrorReply& e);

}  // namespace ddprun::etcd::detail
