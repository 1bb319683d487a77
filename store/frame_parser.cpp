#include "store/frame_parser.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "store/wire.hpp"

namespace ddprun::store {
namespace {

// What a 2.x client sends first: VALIDATE (0x00) + u32 magic 0x3C85F7CE.
constexpr char kTorch2Hello[5] = {'\x00', '\xCE', '\xF7', '\x85', '\x3C'};

std::string hex_byte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", b);
  return buf;
}

}  // namespace

size_t FrameParser::feed(std::string_view data) {
  size_t pos = 0;
  while (pos < data.size() && !ready_ && phase_ != Phase::kFailed) {
    pos += step(data.data() + pos, data.size() - pos);
  }
  return pos;
}

Request FrameParser::take() {
  ready_ = false;
  return std::exchange(request_, Request{});
}

size_t FrameParser::step(const char* p, size_t n) {
  switch (phase_) {
    case Phase::kHello:
      return step_hello(p, n);
    case Phase::kOpcode:
      begin_request(static_cast<uint8_t>(p[0]));
      return 1;
    case Phase::kInteger: {
      size_t k = std::min<size_t>(n, int_width_ - int_have_);
      std::memcpy(int_buf_ + int_have_, p, k);
      int_have_ = static_cast<uint8_t>(int_have_ + k);
      if (int_have_ == int_width_) on_integer();
      return k;
    }
    case Phase::kBytes: {
      size_t k = static_cast<size_t>(std::min<uint64_t>(n, bytes_left_));
      target_->append(p, k);
      bytes_left_ -= k;
      if (bytes_left_ == 0) next_item();
      return k;
    }
    case Phase::kFailed:
      break;
  }
  return n;
}

// 2.x opens with the 5-byte hello; anything else is 1.13. A 1.13 SET also starts with 0x00,
// so matched hello bytes are replayed as 1.13 input on the first mismatch (a SET needs at
// least 17 bytes, so the replayed prefix never completes a request by itself).
size_t FrameParser::step_hello(const char* p, size_t n) {
  size_t i = 0;
  while (i < n && hello_len_ < sizeof kTorch2Hello) {
    if (p[i] != kTorch2Hello[hello_len_]) {
      dialect_ = Dialect::kTorch1;
      phase_ = Phase::kOpcode;
      size_t replayed = 0;
      while (replayed < hello_len_ && phase_ != Phase::kFailed) {
        replayed += step(kTorch2Hello + replayed, hello_len_ - replayed);
      }
      return i;
    }
    ++hello_len_;
    ++i;
  }
  if (hello_len_ == sizeof kTorch2Hello) {
    dialect_ = Dialect::kTorch2;
    phase_ = Phase::kOpcode;
  }
  return i;
}

void FrameParser::allow_only(std::initializer_list<Op> ops) {
  static_assert(sizeof(allowed_) * 8 > static_cast<size_t>(Op::kMultiWaitTagged));
  allowed_ = 0;
  for (Op op : ops) allowed_ |= uint64_t{1} << static_cast<unsigned>(op);
}

void FrameParser::begin_request(uint8_t opcode) {
  spec_ = decode_opcode(dialect_, opcode);
  if (spec_ == nullptr) {
    failed_at_opcode_ = true;
    fail("unknown opcode " + hex_byte(opcode) + " in the " + dialect_name(dialect_) + " dialect");
    return;
  }
  if ((allowed_ & (uint64_t{1} << static_cast<unsigned>(spec_->op))) == 0) {
    failed_at_opcode_ = true;
    fail(std::string(spec_->name) + " (" + dialect_name(dialect_) +
         ") where only AUTH is accepted");
    return;
  }
  request_.op = spec_->op;
  field_ = 0;
  list_left_ = 0;
  pair_value_next_ = false;
  start_field();
}

void FrameParser::start_field() {
  if (field_ == spec_->field_count) {
    ready_ = true;
    phase_ = Phase::kOpcode;
    return;
  }
  switch (spec_->fields[field_]) {
    case Field::kKey:
      return begin_integer(IntRole::kKeyLength, 8);
    case Field::kValue:
      return begin_integer(IntRole::kValueLength, 8);
    case Field::kAuthBlob:
      return begin_integer(IntRole::kBlobLength, 8);
    case Field::kI64:
      return begin_integer(IntRole::kI64, 8);
    case Field::kI64Second:
      return begin_integer(IntRole::kI64Second, 8);
    case Field::kU32:
      return begin_integer(IntRole::kU32, 4);
    case Field::kKeys:
      return begin_integer(IntRole::kKeyCount, 8);
    case Field::kKeyValues:
      return begin_integer(IntRole::kPairCount, 8);
  }
}

// Called when a field or list element is complete: start the next element of a list field,
// the value of a (key, value) pair, or the next field.
void FrameParser::next_item() {
  Field field = spec_->fields[field_];
  if (field == Field::kKeyValues && pair_value_next_) {
    pair_value_next_ = false;
    return begin_integer(IntRole::kValueLength, 8);
  }
  if ((field == Field::kKeys || field == Field::kKeyValues) && list_left_ > 0) {
    --list_left_;
    pair_value_next_ = field == Field::kKeyValues;
    return begin_integer(IntRole::kKeyLength, 8);
  }
  ++field_;
  start_field();
}

void FrameParser::begin_integer(IntRole role, uint8_t width) {
  role_ = role;
  int_width_ = width;
  int_have_ = 0;
  phase_ = Phase::kInteger;
}

void FrameParser::on_integer() {
  uint64_t v = wire::load_le(int_buf_, int_width_);
  const char* op = spec_->name;
  switch (role_) {
    case IntRole::kKeyLength:
      if (v > limits_.max_key) {
        return fail(std::string(op) + " key of " + std::to_string(v) + " bytes exceeds the " +
                    std::to_string(limits_.max_key) + "-byte limit");
      }
      return begin_bytes(&request_.keys.emplace_back(), v);
    case IntRole::kValueLength:
      if (v > limits_.max_value) {
        return fail(std::string(op) + " value of " + std::to_string(v) + " bytes exceeds the " +
                    std::to_string(limits_.max_value) + "-byte limit");
      }
      return begin_bytes(&request_.values.emplace_back(), v);
    case IntRole::kBlobLength:
      if (v != kAuthBytes) {
        return fail(std::string(op) + " field of " + std::to_string(v) + " bytes (expected " +
                    std::to_string(kAuthBytes) + ")");
      }
      return begin_bytes(&request_.values.emplace_back(), v);
    case IntRole::kI64:
      request_.integer = static_cast<int64_t>(v);
      return next_item();
    case IntRole::kI64Second:
      request_.integer2 = static_cast<int64_t>(v);
      return next_item();
    case IntRole::kU32:
      request_.word = static_cast<uint32_t>(v);
      return next_item();
    case IntRole::kKeyCount:
    case IntRole::kPairCount:
      if (v > limits_.max_keys) {
        return fail(std::string(op) + " with " +
                    (role_ == IntRole::kPairCount ? std::to_string(static_cast<int64_t>(v))
                                                  : std::to_string(v)) +
                    " keys exceeds the " + std::to_string(limits_.max_keys) + "-key limit");
      }
      list_left_ = v;
      return next_item();
  }
}

void FrameParser::begin_bytes(std::string* target, uint64_t length) {
  target_ = target;
  bytes_left_ = length;
  if (length == 0) return next_item();
  phase_ = Phase::kBytes;
}

void FrameParser::fail(std::string reason) {
  phase_ = Phase::kFailed;
  ready_ = false;
  error_ = std::move(reason);
  request_ = Request{};
}

}  // namespace ddprun::store
