#include "store/testing/history.hpp"

#include <algorithm>
#include <cstdio>

namespace ddprun::store::testing {
namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", static_cast<unsigned char>(c));
      out += hex;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string joined(const std::vector<std::string>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + quoted(items[i]);
  return out + "}";
}

std::string arguments(const Operation& op) {
  const std::string key = op.keys.empty() ? "?" : quoted(op.keys[0]);
  const std::string value = op.values.empty() ? "?" : quoted(op.values[0]);
  switch (op.kind) {
    case OpKind::kSet:
    case OpKind::kAppend:
    case OpKind::kQueuePush:
      return key + " " + value;
    case OpKind::kAdd:
      return key + " " + (op.delta >= 0 ? "+" : "") + std::to_string(op.delta);
    case OpKind::kCompareSet:
      return key + " " + value + "=>" + (op.values.size() > 1 ? quoted(op.values[1]) : "?");
    case OpKind::kCheck:
    case OpKind::kWait:
    case OpKind::kMultiGet:
      return joined(op.keys);
    case OpKind::kMultiSet: {
      std::string out = "{";
      for (size_t i = 0; i < op.keys.size(); ++i) {
        out += (i ? ", " : "") + quoted(op.keys[i]) + "=" +
               (i < op.values.size() ? quoted(op.values[i]) : "?");
      }
      return out + "}";
    }
    case OpKind::kNumKeys:
      return "";
    case OpKind::kGet:
    case OpKind::kDeleteKey:
    case OpKind::kQueuePop:
    case OpKind::kQueueLen:
      return key;
  }
  return "";
}

std::string result(const Operation& op) {
  if (op.outcome == Outcome::kNoReply) return "";
  if (op.outcome == Outcome::kTimedOut) return " -> timed out";
  switch (op.kind) {
    case OpKind::kGet:
    case OpKind::kCompareSet:
      return " -> " + (op.reply.empty() ? std::string("?") : quoted(op.reply[0]));
    case OpKind::kMultiGet:
      return " -> " + joined(op.reply);
    case OpKind::kQueuePop:
      return " -> " + (op.reply.empty() ? std::string("empty") : quoted(op.reply[0]));
    case OpKind::kCheck:
      return op.number ? " -> present" : " -> missing";
    case OpKind::kWait:
      return " -> released";
    case OpKind::kDeleteKey:
      return op.number ? " -> erased" : " -> absent";
    default:
      return " -> " + std::to_string(op.number);
  }
}

std::string millis(Clock::time_point t, Clock::time_point origin) {
  if (t == Clock::time_point::max()) return "end";
  char text[32];
  std::snprintf(text, sizeof text, "+%.3f",
                std::chrono::duration<double, std::milli>(t - origin).count());
  return text;
}

}  // namespace

bool has_no_reply(OpKind kind) {
  return kind == OpKind::kSet || kind == OpKind::kMultiSet || kind == OpKind::kAppend ||
         kind == OpKind::kQueuePush;
}

bool waits_first(OpKind kind) {
  return kind == OpKind::kWait || kind == OpKind::kGet || kind == OpKind::kMultiGet;
}

bool changes_nothing(const Operation& op) {
  switch (op.kind) {
    case OpKind::kGet:
    case OpKind::kCheck:
    case OpKind::kWait:
    case OpKind::kMultiGet:
    case OpKind::kNumKeys:
    case OpKind::kQueueLen:
      return true;
    case OpKind::kDeleteKey:
      return op.outcome == Outcome::kReply && op.number == 0;
    case OpKind::kQueuePop:
      return op.outcome == Outcome::kReply && op.reply.empty();
    case OpKind::kCompareSet:
      // The store replies `desired` exactly when it stored it.
      return op.outcome == Outcome::kReply && op.values.size() == 2 && op.reply.size() == 1 &&
             op.reply[0] != op.values[1];
    default:
      return false;
  }
}

const char* op_name(OpKind kind) {
  switch (kind) {
    case OpKind::kSet:
      return "SET";
    case OpKind::kGet:
      return "GET";
    case OpKind::kAdd:
      return "ADD";
    case OpKind::kCompareSet:
      return "COMPARE_SET";
    case OpKind::kDeleteKey:
      return "DELETE_KEY";
    case OpKind::kCheck:
      return "CHECK";
    case OpKind::kWait:
      return "WAIT";
    case OpKind::kMultiGet:
      return "MULTI_GET";
    case OpKind::kMultiSet:
      return "MULTI_SET";
    case OpKind::kAppend:
      return "APPEND";
    case OpKind::kNumKeys:
      return "GETNUMKEYS";
    case OpKind::kQueuePush:
      return "QUEUE_PUSH";
    case OpKind::kQueuePop:
      return "QUEUE_POP";
    case OpKind::kQueueLen:
      return "QUEUE_LEN";
  }
  return "?";
}

std::string describe(const Operation& op, Clock::time_point origin) {
  std::string args = arguments(op);
  return "c" + std::to_string(op.client) + " " + op_name(op.kind) + (args.empty() ? "" : " ") +
         args + result(op) + " [" + millis(op.invoked, origin) + ", " +
         millis(op.responded, origin) + " ms]";
}

Clock::time_point history_origin(const History& history) {
  Clock::time_point origin = Clock::time_point::max();
  for (const Operation& op : history) origin = std::min(origin, op.invoked);
  return history.empty() ? Clock::time_point() : origin;
}

}  // namespace ddprun::store::testing
