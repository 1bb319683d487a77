// Incremental parser of TCPStore request frames, separate from any I/O so it can be unit
// tested and fuzzed. Feed it bytes as they arrive, in any split; it yields one Request at a
// time and detects the connection's dialect from the first bytes.
//
// Safety: every length and count is checked against Limits the moment it is read, before a
// byte is buffered for it; buffers then grow only with bytes actually received. A malformed
// stream puts the parser in a sticky failed state with a one-line reason.
//
// Not thread-safe; one parser per connection.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "store/protocol.hpp"

namespace ddprun::store {

class FrameParser {
 public:
  explicit FrameParser(const Limits& limits) : limits_(limits) {}

  // Consumes a prefix of `data` and returns its length. Stops early once a request is
  // complete (ready()) or the stream is malformed (failed()); call again with the rest.
  size_t feed(std::string_view data);

  bool ready() const { return ready_; }
  // Moves the completed request out; the parser then continues with the next frame.
  Request take();

  bool failed() const { return phase_ == Phase::kFailed; }
  const std::string& error() const { return error_; }
  Dialect dialect() const { return dialect_; }
  // True between frames (no partial request buffered).
  bool at_frame_boundary() const { return phase_ == Phase::kOpcode && !ready_; }

  // Until a connection has authenticated: the ops its next request may be. Any other opcode
  // (in either dialect) fails at its first byte, before a byte is buffered for it. Set it
  // between requests; allow_all() lifts it (the default).
  void allow_only(std::initializer_list<Op> ops);
  void allow_all() { allowed_ = ~uint64_t{0}; }
  // The failure was the opcode itself (unknown, or not allowed), not a later field.
  bool failed_at_opcode() const { return failed() && failed_at_opcode_; }

 private:
  enum class Phase : uint8_t { kHello, kOpcode, kInteger, kBytes, kFailed };
  enum class IntRole : uint8_t {
    kKeyLength,
    kValueLength,
    kBlobLength,
    kI64,
    kI64Second,
    kU32,
    kKeyCount,
    kPairCount
  };

  size_t step(const char* p, size_t n);
  size_t step_hello(const char* p, size_t n);
  void begin_request(uint8_t opcode);
  void start_field();
  void next_item();
  void begin_integer(IntRole role, uint8_t width);
  void on_integer();
  void begin_bytes(std::string* target, uint64_t length);
  void fail(std::string reason);

  Limits limits_;
  Dialect dialect_ = Dialect::kUnknown;
  Phase phase_ = Phase::kHello;
  IntRole role_ = IntRole::kI64;
  uint8_t hello_len_ = 0;
  uint8_t int_have_ = 0;
  uint8_t int_width_ = 0;
  uint8_t field_ = 0;
  bool pair_value_next_ = false;
  bool ready_ = false;
  bool failed_at_opcode_ = false;
  uint64_t allowed_ = ~uint64_t{0};  // bit i: Op i may start the next request
  char int_buf_[8] = {};
  const OpSpec* spec_ = nullptr;
  uint64_t list_left_ = 0;
  uint64_t bytes_left_ = 0;
  std::string* target_ = nullptr;
  Request request_;
  std::string error_;
};

}  // namespace ddprun::store
