// Request frames of the torch 2.x dialect and the reply limit, shared by our two clients
// (Client, blocking; AsyncClient, on an io_context) so both send exactly the same bytes.
// Internal to store/: pure functions, no I/O.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "store/client.hpp"
#include "store/protocol.hpp"
#include "store/wire.hpp"

namespace ddprun::store::client_frames {

// Replies longer than this are treated as a protocol error rather than allocated.
inline constexpr uint64_t kMaxReplyBytes = 1ull << 30;

inline std::string frame(Op op) {
  std::string out;
  wire::put_u8(out, torch2_opcode(op));
  return out;
}

inline std::string frame(Op op, std::string_view key) {
  std::string out = frame(op);
  wire::put_bytes(out, key);
  return out;
}

// CHECK, WAIT, MULTI_GET: a key count, then the keys.
inline std::string frame_keys(Op op, const std::vector<std::string>& keys) {
  std::string out = frame(op);
  wire::put_u64(out, keys.size());
  for (const std::string& key : keys) wire::put_bytes(out, key);
  return out;
}

// SET, APPEND, QUEUE_PUSH: a key and one value.
inline std::string key_value_frame(Op op, std::string_view key, std::string_view value) {
  std::string out = frame(op, key);
  wire::put_bytes(out, value);
  return out;
}

// COMPARE_SET, SET_WILL: a key, the expected value, the desired value.
inline std::string compare_set_frame(Op op, std::string_view key, std::string_view expected,
                                     std::string_view desired) {
  std::string out = frame(op, key);
  wire::put_bytes(out, expected);
  wire::put_bytes(out, desired);
  return out;
}

// ADD, BARRIER: a key and an i64.
inline std::string key_i64_frame(Op op, std::string_view key, int64_t value) {
  std::string out = frame(op, key);
  wire::put_i64(out, value);
  return out;
}

inline std::string multi_set_frame(const std::vector<std::pair<std::string, std::string>>& kvs) {
  std::string out = frame(Op::kMultiSet);
  wire::put_i64(out, static_cast<int64_t>(kvs.size()));
  for (const auto& [key, value] : kvs) {
    wire::put_bytes(out, key);
    wire::put_bytes(out, value);
  }
  return out;
}

inline std::string ping_frame(uint32_t nonce) {
  std::string out = frame(Op::kPing);
  wire::put_u32(out, nonce);
  return out;
}

// The torch 2.x opening: VALIDATE with the magic, then PING (the server echoes the nonce).
inline std::string hello_frame(uint32_t nonce) {
  std::string out = frame(Op::kValidate);
  wire::put_u32(out, kValidationMagic);
  out += ping_frame(nonce);
  return out;
}

// A client with a token opens with the 2.x hello and AUTH (no PING: a store with a token
// answers nothing else first).
inline std::string auth_hello_frame(std::string_view client_nonce) {
  std::string out = frame(Op::kValidate);
  wire::put_u32(out, kValidationMagic);
  wire::put_u8(out, kAuthOpcode);
  wire::put_bytes(out, client_nonce);
  return out;
}

// Its second flight: the proof, then the usual PING (acknowledged 0x01, then echoed).
inline std::string auth_proof_frame(std::string_view proof, uint32_t nonce) {
  std::string out = frame(Op::kAuthProof);
  wire::put_bytes(out, proof);
  out += ping_frame(nonce);
  return out;
}

inline StoreError auth_error(AuthFailure failure, const std::string& peer) {
  const std::string at = "the store at " + peer;
  switch (failure) {
    case AuthFailure::kRefused:
      return StoreError(failure, at + " refused this client's token");
    case AuthFailure::kServerUnproven:
      return StoreError(failure, at + " did not prove it knows the token");
    case AuthFailure::kServerOpen:
      return StoreError(failure, at + " does not ask for a token (started without one?)");
    case AuthFailure::kTokenRequired:
      return StoreError(failure, at + " asks for a token and this client has none");
    case AuthFailure::kUnsupported:
    case AuthFailure::kNone:
      break;
  }
  return StoreError(AuthFailure::kUnsupported,
                    at + " closed the connection at AUTH (not a ddprun store, or an older one)");
}

inline std::string keep_alive_frame(std::chrono::milliseconds interval, int probes) {
  std::string out = frame(Op::kKeepAlive);
  wire::put_i64(out, interval.count());
  wire::put_u32(out, static_cast<uint32_t>(probes));
  return out;
}

}  // namespace ddprun::store::client_frames
