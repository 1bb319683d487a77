#include "store/protocol.hpp"

#include <array>
#include <stdexcept>

namespace ddprun::store {
namespace {

using F = Field;

// Indexed by Op. Field layouts are the same in both dialects for the ops both have.
constexpr OpSpec kSpecs[] = {
    {Op::kValidate, "VALIDATE", 1, {F::kU32}},
    {Op::kSet, "SET", 2, {F::kKey, F::kValue}},
    {Op::kCompareSet, "COMPARE_SET", 3, {F::kKey, F::kValue, F::kValue}},
    {Op::kGet, "GET", 1, {F::kKey}},
    {Op::kAdd, "ADD", 2, {F::kKey, F::kI64}},
    {Op::kCheck, "CHECK", 1, {F::kKeys}},
    {Op::kWait, "WAIT", 1, {F::kKeys}},
    {Op::kGetNumKeys, "GETNUMKEYS", 0, {}},
    {Op::kWatchKey, "WATCH_KEY", 1, {F::kKey}},
    {Op::kDeleteKey, "DELETE_KEY", 1, {F::kKey}},
    {Op::kAppend, "APPEND", 2, {F::kKey, F::kValue}},
    {Op::kMultiGet, "MULTI_GET", 1, {F::kKeys}},
    {Op::kMultiSet, "MULTI_SET", 1, {F::kKeyValues}},
    {Op::kCancelWait, "CANCEL_WAIT", 0, {}},
    {Op::kPing, "PING", 1, {F::kU32}},
    {Op::kQueuePush, "QUEUE_PUSH", 2, {F::kKey, F::kValue}},
    {Op::kQueuePop, "QUEUE_POP", 1, {F::kKey}},
    {Op::kQueueLen, "QUEUE_LEN", 1, {F::kKey}},
    {Op::kListKeys, "LIST_KEYS", 0, {}},
    {Op::kBarrier, "BARRIER", 2, {F::kKey, F::kI64}},
    {Op::kSetWill, "SET_WILL", 3, {F::kKey, F::kValue, F::kValue}},
    {Op::kKeepAlive, "KEEP_ALIVE", 2, {F::kI64, F::kU32}},
    {Op::kAuth, "AUTH", 1, {F::kAuthBlob}},
    {Op::kAuthProof, "AUTH_PROOF", 1, {F::kAuthBlob}},
    {Op::kMux, "MUX", 2, {F::kI64, F::kI64Second}},
    {Op::kWaitTagged, "WAIT_TAGGED", 2, {F::kU32, F::kKeys}},
    {Op::kBarrierTagged, "BARRIER_TAGGED", 3, {F::kU32, F::kKey, F::kI64}},
    {Op::kCancelTagged, "CANCEL_TAGGED", 1, {F::kU32}},
    {Op::kMuxSync, "MUX_SYNC", 1, {F::kI64}},
    {Op::kMultiWaitTagged, "MULTI_WAIT_TAGGED", 3, {F::kU32, F::kKeys, F::kValue}},
};
constexpr size_t kOpCount = sizeof(kSpecs) / sizeof(kSpecs[0]);

// Opcode byte -> op, per dialect (dense from 0x00). The ddprun-only ops (0x40+ in the 2.x
// numbering: SET_WILL, KEEP_ALIVE, AUTH, AUTH_PROOF) have a spec above, a case in decode_opcode()
// and torch2_opcode() for their byte, and a handler in Session.
constexpr Op kTorch1Ops[] = {Op::kSet,  Op::kCompareSet, Op::kGet,      Op::kAdd,      Op::kCheck,
                             Op::kWait, Op::kGetNumKeys, Op::kWatchKey, Op::kDeleteKey};
constexpr Op kTorch2Ops[] = {Op::kValidate,   Op::kSet,      Op::kCompareSet, Op::kGet,
                             Op::kAdd,        Op::kCheck,    Op::kWait,       Op::kGetNumKeys,
                             Op::kDeleteKey,  Op::kAppend,   Op::kMultiGet,   Op::kMultiSet,
                             Op::kCancelWait, Op::kPing,     Op::kQueuePush,  Op::kQueuePop,
                             Op::kQueueLen,   Op::kListKeys, Op::kBarrier};

constexpr bool specs_indexed_by_op() {
  for (size_t i = 0; i < kOpCount; ++i) {
    if (static_cast<size_t>(kSpecs[i].op) != i) return false;
  }
  return true;
}
static_assert(specs_indexed_by_op());
static_assert(sizeof(kTorch2Ops) / sizeof(Op) == 0x13);
static_assert(sizeof(kTorch1Ops) / sizeof(Op) == 0x09);

template <size_t N>
int find_opcode(const Op (&table)[N], Op op) {
  for (size_t i = 0; i < N; ++i) {
    if (table[i] == op) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

const OpSpec* decode_opcode(Dialect dialect, uint8_t opcode) {
  switch (dialect) {
    case Dialect::kTorch1:
      if (opcode < std::size(kTorch1Ops)) return &op_spec(kTorch1Ops[opcode]);
      return nullptr;
    case Dialect::kTorch2:
      if (opcode < std::size(kTorch2Ops)) return &op_spec(kTorch2Ops[opcode]);
      if (opcode == kSetWillOpcode) return &op_spec(Op::kSetWill);
      if (opcode == kKeepAliveOpcode) return &op_spec(Op::kKeepAlive);
      if (opcode == kAuthOpcode) return &op_spec(Op::kAuth);
      if (opcode == kAuthProofOpcode) return &op_spec(Op::kAuthProof);
      if (opcode == kMuxOpcode) return &op_spec(Op::kMux);
      if (opcode == kWaitTaggedOpcode) return &op_spec(Op::kWaitTagged);
      if (opcode == kBarrierTaggedOpcode) return &op_spec(Op::kBarrierTagged);
      if (opcode == kCancelTaggedOpcode) return &op_spec(Op::kCancelTagged);
      if (opcode == kMuxSyncOpcode) return &op_spec(Op::kMuxSync);
      if (opcode == kMultiWaitTaggedOpcode) return &op_spec(Op::kMultiWaitTagged);
      return nullptr;
    case Dialect::kUnknown:
      break;
  }
  return nullptr;
}

const OpSpec& op_spec(Op op) {
  return kSpecs[static_cast<size_t>(op)];
}

uint8_t torch2_opcode(Op op) {
  if (op == Op::kSetWill) return kSetWillOpcode;
  if (op == Op::kKeepAlive) return kKeepAliveOpcode;
  if (op == Op::kAuth) return kAuthOpcode;
  if (op == Op::kAuthProof) return kAuthProofOpcode;
  if (op == Op::kMux) return kMuxOpcode;
  if (op == Op::kWaitTagged) return kWaitTaggedOpcode;
  if (op == Op::kBarrierTagged) return kBarrierTaggedOpcode;
  if (op == Op::kCancelTagged) return kCancelTaggedOpcode;
  if (op == Op::kMuxSync) return kMuxSyncOpcode;
  if (op == Op::kMultiWaitTagged) return kMultiWaitTaggedOpcode;
  int code = find_opcode(kTorch2Ops, op);
  if (code < 0) throw std::invalid_argument(std::string(op_spec(op).name) + " is not a 2.x op");
  return static_cast<uint8_t>(code);
}

uint8_t torch1_opcode(Op op) {
  int code = find_opcode(kTorch1Ops, op);
  if (code < 0) throw std::invalid_argument(std::string(op_spec(op).name) + " is not a 1.13 op");
  return static_cast<uint8_t>(code);
}

const char* dialect_name(Dialect dialect) {
  switch (dialect) {
    case Dialect::kTorch1:
      return "torch-1.13";
    case Dialect::kTorch2:
      return "torch-2.x";
    case Dialect::kUnknown:
      break;
  }
  return "unknown";
}

}  // namespace ddprun::store
