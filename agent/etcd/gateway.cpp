#include "agent/etcd/gateway.hpp"

#include <exception>

namespace ddprun::etcd::detail {

int64_t i64(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_string()) return std::stoll(it->get<std::string>());
  return it->get<int64_t>();
}

std::string bytes(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return {};
  return base64_decode(it->get<std::string>());
}

KeyValue kv_from(const json& j) {
  KeyValue kv;
  kv.key = bytes(j, "key");
  kv.value = bytes(j, "value");
  kv.create_revision = i64(j, "create_revision");
  kv.mod_revision = i64(j, "mod_revision");
  kv.version = i64(j, "version");
  kv.lease = i64(j, "lease");
  return kv;
}

json op_json(const Op& op) {
  switch (op.kind) {
    case Op::Kind::kRange:
      return {{"request_range", {{"key", base64_encode(op.key)}}}};
    case Op::Kind::kPut: {
      json put = {{"key", base64_encode(op.key)}, {"value", base64_encode(op.value)}};
      if (op.lease) put["lease"] = std::to_string(op.lease);
      return {{"request_put", std::move(put)}};
    }
    case Op::Kind::kDelete:
      return {{"request_delete_range", {{"key", base64_encode(op.key)}}}};
  }
  return {};
}

json compare_json(const Compare& c) {
  json j = {{"key", base64_encode(c.key)}, {"result", "EQUAL"}};
  switch (c.target) {
    case Compare::Target::kCreate:
      j["target"] = "CREATE";
      j["create_revision"] = std::to_string(c.revision);
      break;
    case Compare::Target::kMod:
      j["target"] = "MOD";
      j["mod_revision"] = std::to_string(c.revision);
      break;
    case Compare::Target::kValue:
      j["target"] = "VALUE";
      j["value"] = base64_encode(c.value);
      break;
  }
  return j;
}

ErrorReply error_of(const std::string& body) {
  ErrorReply e;
  try {
    json j = json::parse(body);
    if (j.contains("result") && j["result"].is_object() == false && j.contains("error")) {
      j = j["error"];
    }
    if (j.contains("error") && j["error"].is_object()) j = j["error"];
    e.code = j.value("code", j.value("grpc_code", 0));
    e.message = j.value("message", j.value("error", std::string()));
  } catch (const std::exception&) {
    e.message = body.substr(0, 200);
  }
  return e;
}

bool retryable(unsigned status, const ErrorReply& e) {
  // gRPC Unavailable (14), DeadlineExceeded (4), Aborted (10); etcd's "no leader", "leader
  // changed", "request timed out" and "too many requests" pass on to another member or wait.
  // A member shutting down answers "the client connection is closing" (Canceled, 1).
  if (status >= 500 && status != 501) return true;
  if (e.code == 1 || e.code == 4 || e.code == 8 || e.code == 10 || e.code == 14) return true;
  for (const char* s : {"no leader", "leader changed", "timed out", "too many requests",
                        "not capable", "stopped", "closing", "unhealthy"}) {
    if (e.message.find(s) != std::string::npos) return true;
  }
  return false;
}

bool auth_failure(unsigned status, const ErrorReply& e) {
  return status == 401 || status == 403 || e.code == 16 || e.code == 7 ||
         e.message.find("user name is empty") != std::string::npos ||
         e.message.find("invalid auth token") != std::string::npos;
}

}  // namespace ddprun::etcd::detail
