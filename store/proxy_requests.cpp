// StoreProxy::Impl (proxy_impl.hpp): what each client request becomes. The proxy answers some
// itself (VALIDATE, PING, AUTH, KEEP_ALIVE, SET_WILL, CANCEL_WAIT); ADD, GET, WAIT and SET join
// a lane (proxy.cpp, proxy_lanes.cpp); the rest pass through to the upstream link in order.
#include <string>
#include <vector>

#include "store/proxy_impl.hpp"
#include "store/wire.hpp"

namespace ddprun::store {

using proxy::LocalClient;
using proxy::Shape;
using proxy::Slot;

std::string proxy::encode(const Request& r) {
  std::string out;
  wire::put_u8(out, torch2_opcode(r.op));
  const OpSpec& spec = op_spec(r.op);
  size_t key = 0, value = 0;
  for (uint8_t i = 0; i < spec.field_count; ++i) {
    switch (spec.fields[i]) {
      case Field::kKey:
        wire::put_bytes(out, r.keys[key++]);
        break;
      case Field::kValue:
      case Field::kAuthBlob:
        wire::put_bytes(out, r.values[value++]);
        break;
      case Field::kI64:
        wire::put_i64(out, r.integer);
        break;
      case Field::kI64Second:
        wire::put_i64(out, r.integer2);
        break;
      case Field::kU32:
        wire::put_u32(out, r.word);
        break;
      case Field::kKeys:
        wire::put_u64(out, r.keys.size());
        for (const std::string& k : r.keys) wire::put_bytes(out, k);
        break;
      case Field::kKeyValues:
        wire::put_i64(out, static_cast<int64_t>(r.keys.size()));
        for (size_t j = 0; j < r.keys.size(); ++j) {
          wire::put_bytes(out, r.keys[j]);
          wire::put_bytes(out, r.values[j]);
        }
        break;
    }
  }
  return out;
}

namespace {

std::string byte_text(uint8_t b) {
  return std::string(1, static_cast<char>(b));
}

// The reply layout of an op passed through; false for an op without a reply.
bool reply_shape(Op op, Shape* shape) {
  switch (op) {
    case Op::kGet:
    case Op::kCompareSet:
      *shape = Shape::kBytes;
      return true;
    case Op::kAdd:
    case Op::kGetNumKeys:
    case Op::kDeleteKey:
    case Op::kQueueLen:
      *shape = Shape::kI64;
      return true;
    case Op::kCheck:
      *shape = Shape::kU8;
      return true;
    case Op::kMultiGet:
      *shape = Shape::kValues;
      return true;
    case Op::kQueuePop:
      *shape = Shape::kQueuePop;
      return true;
    case Op::kListKeys:
      *shape = Shape::kListKeys;
      return true;
    default:
      return false;
  }
}

// A WAIT's key list as one lane name (a length before each key keeps it unambiguous).
std::string lane_name(const std::vector<std::string>& keys) {
  std::string name;
  for (const std::string& k : keys) wire::put_bytes(name, k);
  return name;
}

}  // namespace

void StoreProxy::Impl::issue(LocalClient& c, Request& r) {
  ++stats_.client_requests;
  if (answer_here(c, r)) return;
  switch (r.op) {
    case Op::kWait:
    case Op::kBarrier:
      if (c.pending_wait()) {
        return c.close(std::string(op_spec(r.op).name) + " while a WAIT is pending");
      }
      if (r.op == Op::kBarrier) return barrier(c, r);
      if (r.keys.empty()) return c.owe()->fill(byte_text(kStopWaiting));
      return join(kWait, lane_name(r.keys), c, r);
    case Op::kAdd:
      return join(kAdd, r.keys[0], c, r);
    case Op::kGet:
      return join(kGet, r.keys[0], c, r);
    case Op::kSet:
      return join(kSet, std::string(), c, r);
    case Op::kMultiGet:
      if (r.keys.empty()) return c.owe()->fill({});
      return pass_through(c, r);
    case Op::kAuthProof:
    case Op::kMux:
    case Op::kWaitTagged:
    case Op::kBarrierTagged:
    case Op::kCancelTagged:
      return c.close(std::string(op_spec(r.op).name) + " sent to a store proxy");
    default:
      return pass_through(c, r);
  }
}

bool StoreProxy::Impl::answer_here(LocalClient& c, Request& r) {
  auto ack = [&c](uint8_t b) { c.owe()->fill(byte_text(b)); };
  switch (r.op) {
    case Op::kValidate:
      if (r.word != kValidationMagic) c.close("VALIDATE with a wrong magic number");
      return true;
    case Op::kPing: {
      std::string echo;
      wire::put_u32(echo, r.word);
      c.owe()->fill(echo);
      return true;
    }
    case Op::kWatchKey:
      ack(kWatchRegistered);
      return true;
    case Op::kAuth:
      ack(kAuthOpen);  // the proxy is open to its (loopback) clients
      return true;
    case Op::kKeepAlive:
      if (r.integer <= 0 || r.word == 0) {
        c.close("KEEP_ALIVE with bad values");
      } else {
        ack(kExtensionAck);
      }
      return true;
    case Op::kSetWill:
      if (r.keys[0].empty()) {
        c.will().reset();
      } else {
        c.will() = LocalClient::Will{r.keys[0], r.values[0], r.values[1]};
      }
      ack(kExtensionAck);
      return true;
    case Op::kCancelWait:
      if (auto& w = c.pending_wait()) {
        LocalClient::PendingWait wait = std::move(*w);
        w.reset();
        wait.cancel();
        wait.slot->drop();
      }
      ack(kWaitCanceled);
      return true;
    default:
      return false;
  }
}

void StoreProxy::Impl::pass_through(LocalClient& c, Request& r) {
  Shape shape;
  if (reply_shape(r.op, &shape)) {
    std::shared_ptr<Slot> slot = c.owe();
    upstream_->send(proxy::encode(r), shape, r.keys.size(),
                    [slot](std::string_view reply, bool) { slot->fill(reply); });
  } else {
    upstream_->send(proxy::encode(r));
  }
  schedule_flush();
}

// The request gathers with the lane's next group; its client waits until that group is sent
// (an ADD: until its reply, so the group's ADD can be split if the store refuses it).
}  // namespace ddprun::store
