// The c10d TCPStore wire protocol: opcodes of both dialects, limits and the decoded request.
// Pure data and functions (no I/O, no Boost) so the frame parser builds anywhere, including
// the clang libFuzzer build. See PROTOCOL.md for the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::store {

// Per-request limits, checked by the frame parser as soon as a length or count is read,
// before any byte is buffered for it (PyTorch's newest server uses the same defaults).
struct Limits {
  size_t max_key = 8 << 10;     // bytes per key
  size_t max_value = 8 << 20;   // bytes per value (SET, APPEND, COMPARE_SET, QUEUE_PUSH, ...)
  size_t max_keys = 128 << 10;  // keys per CHECK/WAIT/MULTI_GET/MULTI_SET request
};

// Torch 1.13 and torch 2.x number their opcodes differently; a connection's dialect is told
// from its first bytes (2.x opens with VALIDATE + magic).
enum class Dialect : uint8_t { kUnknown, kTorch1, kTorch2 };

// Operations, independent of the dialect's numbering.
enum class Op : uint8_t {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kWatchKey,  // 1.13 only
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  kBarrier,
  // ddprun-only extensions, 2.x dialect only (opcodes 0x40+, see kSetWillOpcode):
  kSetWill,    // str key, bytes expected, bytes desired -> u8 kExtensionAck
  kKeepAlive,  // i64 interval_ms, u32 probes -> u8 kExtensionAck
  kAuth,       // auth client nonce -> u8 kAuthOpen, or kAuthChallenge + server nonce + proof
  kAuthProof,  // auth client proof -> u8 kExtensionAck (a wrong proof: the connection closes)
  // The proxy's multiplexed connection (PROTOCOL.md, "Multiplexed connections"):
  kMux,              // i64 session, i64 received -> u8 kExtensionAck, i64 session, i64 consumed;
                     // from then on every reply is framed (kMuxReply...)
  kWaitTagged,       // u32 tag, keys -> later a kMuxRelease frame with the tag
  kBarrierTagged,    // u32 tag, key, i64 world size -> later a kMuxRelease frame with the tag
  kCancelTagged,     // u32 tag -> u8: kMuxCancelled if it was parked, kMuxNotParked if not
  kMuxSync,          // i64 received -> i64 consumed (the stream positions, for resuming)
  kMultiWaitTagged,  // u32 first tag, keys, bytes counts (u32 each) -> n tagged waits, wait i
                     // (tag first + i) on the next counts[i] keys
};

// Field layout of a request after its opcode byte.
enum class Field : uint8_t {
  kKey,        // u64 length + bytes, length <= Limits::max_key
  kValue,      // u64 length + bytes, length <= Limits::max_value
  kI64,        // 8 bytes little-endian
  kI64Second,  // 8 bytes little-endian, a request's second integer (Request::integer2)
  kU32,        // 4 bytes little-endian
  kKeys,       // u64 n (<= max_keys), then n keys
  kKeyValues,  // i64 n (<= max_keys), then n (key, value) pairs
  kAuthBlob,   // u64 length, exactly kAuthBytes, + bytes (AUTH's nonce and proof)
};

struct OpSpec {
  Op op;
  const char* name;
  uint8_t field_count;
  Field fields[3];
};

inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;  // sent as CE F7 85 3C

// Reply bytes of WAIT/BARRIER/CANCEL_WAIT, CHECK and 1.13's WATCH_KEY.
inline constexpr uint8_t kStopWaiting = 0x00;
inline constexpr uint8_t kWaitCanceled = 0x01;
inline constexpr uint8_t kCheckReady = 0x00;
inline constexpr uint8_t kCheckNotReady = 0x01;
inline constexpr uint8_t kWatchRegistered = 0x03;

// ddprun-only ops in the 2.x numbering (torch 2.x uses 0x00-0x12; 0x40+ is left to us).
// SET_WILL: when this connection ends, for any reason, the server applies
// COMPARE_SET(key, expected, desired) (an empty key clears the will; a new will replaces the
// previous one). KEEP_ALIVE: TCP keep-alive on the server's end of this connection (idle =
// interval, then a probe every interval; dropped, and the will applied, after about
// interval x probes of silence from a vanished peer). Both reply kExtensionAck. A server
// without them (torch's) closes the connection: that is how a client learns they are missing.
inline constexpr uint8_t kSetWillOpcode = 0x40;
inline constexpr uint8_t kKeepAliveOpcode = 0x41;
inline constexpr uint8_t kExtensionAck = 0x01;

// Token authentication (ddprun-only, see PROTOCOL.md "AUTH"): a mutual challenge-response
// with HMAC-SHA256 over random nonces; the token itself never crosses the wire. A store
// started with a token accepts nothing else as a connection's first request (after the 2.x
// hello); PING is answered with kAuthRequiredWord instead of its nonce, then the connection
// is closed, so a client without a token learns why at once.
inline constexpr uint8_t kAuthOpcode = 0x42;
// Multiplexed connections (ddprun-only, PROTOCOL.md "Multiplexed connections"): a store proxy
// forwards many clients' requests over one connection, so a wait there must not hold back the
// replies behind it. After MUX each reply is framed: kMuxReply + the op's usual reply, or
// kMuxRelease + u32 tag when a tagged wait (WAIT_TAGGED, BARRIER_TAGGED) is released, which
// may come between any two replies. Plain WAIT, BARRIER and CANCEL_WAIT close a mux connection.
inline constexpr uint8_t kMuxOpcode = 0x44;
inline constexpr uint8_t kWaitTaggedOpcode = 0x45;
inline constexpr uint8_t kBarrierTaggedOpcode = 0x46;
inline constexpr uint8_t kCancelTaggedOpcode = 0x47;
inline constexpr uint8_t kMuxSyncOpcode = 0x48;
inline constexpr uint8_t kMultiWaitTaggedOpcode = 0x49;
inline constexpr uint8_t kMuxReply = 0x00;
inline constexpr uint8_t kMuxRelease = 0x01;
// An ADD (or BARRIER_TAGGED) the store refuses (a value that is not a decimal integer, an
// overflow) would close a plain connection; a mux connection carries many clients, so it gets
// kMuxFailed + bytes reason in the reply's place (kMuxTagFailed + u32 tag + bytes reason for a
// tagged barrier) and stays open; the store is unchanged.
inline constexpr uint8_t kMuxFailed = 0x02;
inline constexpr uint8_t kMuxTagFailed = 0x03;
inline constexpr uint8_t kMuxCancelled = 0x01;
// MUX naming a session the store does not have (expired, or another store): this byte, then the
// connection closes.
inline constexpr uint8_t kMuxUnknownSession = 0x00;
inline constexpr uint8_t kMuxNotParked = 0x00;
// Tagged waits one mux connection may hold parked at once (one per distinct wait its proxy's
// clients have open); more closes it.
inline constexpr size_t kMaxTaggedWaits = 1 << 16;
inline constexpr uint8_t kAuthProofOpcode = 0x43;
inline constexpr size_t kAuthBytes = 32;         // nonces and proofs (SHA-256 output)
inline constexpr uint8_t kAuthOpen = 0x00;       // AUTH reply: this store has no token
inline constexpr uint8_t kAuthChallenge = 0x01;  // AUTH reply: server nonce and proof follow
// "AUTH" on the wire; above every pid, which is what our clients use as their PING nonce.
inline constexpr uint32_t kAuthRequiredWord = 0x48545541;

// Decodes an opcode byte of a known dialect; nullptr for an opcode the dialect lacks.
const OpSpec* decode_opcode(Dialect dialect, uint8_t opcode);
// The spec of an op (name and fields).
const OpSpec& op_spec(Op op);
// The 2.x opcode byte of an op (our client speaks 2.x); throws std::invalid_argument for
// WATCH_KEY, which 2.x lacks.
uint8_t torch2_opcode(Op op);
// The 1.13 opcode byte of an op; throws std::invalid_argument where 1.13 lacks the op.
uint8_t torch1_opcode(Op op);
const char* dialect_name(Dialect dialect);

// One decoded request. Which members are used depends on op (see OpSpec::fields):
// keys holds the kKey/kKeys fields in order, values the kValue fields (COMPARE_SET:
// expected then desired; MULTI_SET: one per key), integer the kI64 field, word the kU32.
struct Request {
  Op op = Op::kGetNumKeys;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t integer = 0;
  int64_t integer2 = 0;  // MUX's second integer
  uint32_t word = 0;
};

}  // namespace ddprun::store
