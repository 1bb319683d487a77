#include "agent/hang/fr_pickle.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

namespace ddprun::agent {

namespace {

using nlohmann::json;

constexpr int kMaxDepth = 64;

// A value as the pickle builds it: containers are shared, so that a memo entry taken before a
// container is filled sees what is added to it later (as in Python).
struct Node {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kList, kDict } kind = Kind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<std::shared_ptr<Node>> items;                                      // kList
  std::vector<std::pair<std::shared_ptr<Node>, std::shared_ptr<Node>>> entries;  // kDict
};
using NodePtr = std::shared_ptr<Node>;

NodePtr make(Node::Kind kind) {
  auto n = std::make_shared<Node>();
  n->kind = kind;
  return n;
}

[[noreturn]] void fail(const std::string& why) {
  throw std::runtime_error(why);
}

json to_json(const Node& n, int depth) {
  if (depth > kMaxDepth) fail("nested deeper than 64");
  switch (n.kind) {
    case Node::Kind::kNone:
      return nullptr;
    case Node::Kind::kBool:
      return n.b;
    case Node::Kind::kInt:
      return n.i;
    case Node::Kind::kFloat:
      return n.f;
    case Node::Kind::kString:
      return n.s;
    case Node::Kind::kList: {
      json out = json::array();
      for (const auto& item : n.items) out.push_back(to_json(*item, depth + 1));
      return out;
    }
    case Node::Kind::kDict: {
      json out = json::object();
      for (const auto& [k, v] : n.entries) {
        std::string key;
        if (k->kind == Node::Kind::kString) {
          key = k->s;
        } else if (k->kind == Node::Kind::kInt) {
          key = std::to_string(k->i);
        } else {
          fail("a dictionary key that is not a string or an integer");
        }
        out[key] = to_json(*v, depth + 1);
      }
      return out;
    }
  }
  return nullptr;
}

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  NodePtr run() {
    for (;;) {
      const uint8_t op = byte();
      if (op == '.') break;  // STOP
      step(op);
    }
    if (stack_.size() != 1 || !stack_.back()) fail("not one value at STOP");
    return stack_.back();
  }

 private:
  uint8_t byte() {
    if (pos_ >= data_.size()) fail("truncated");
    return static_cast<uint8_t>(data_[pos_++]);
  }
  uint64_t little(size_t n) {  // n <= 8
    if (data_.size() - pos_ < n) fail("truncated");
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_ + k])) << (8 * k);
    pos_ += n;
    return v;
  }
  std::string text(size_t n) {
    if (data_.size() - pos_ < n) fail("truncated");
    std::string s(data_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  void push(NodePtr n) { stack_.push_back(std::move(n)); }
  NodePtr pop() {
    if (stack_.empty() || !stack_.back()) fail("stack underflow");
    NodePtr n = std::move(stack_.back());
    stack_.pop_back();
    return n;
  }
  NodePtr& top() {
    if (stack_.empty() || !stack_.back()) fail("stack underflow");
    return stack_.back();
  }
  // The values above the last MARK, which is removed.
  std::vector<NodePtr> since_mark() {
    std::vector<NodePtr> out;
    while (!stack_.empty() && stack_.back()) {
      out.push_back(std::move(stack_.back()));
      stack_.pop_back();
    }
    if (stack_.empty()) fail("no MARK");
    stack_.pop_back();  // the MARK (a null entry)
    return {out.rbegin(), out.rend()};
  }
  NodePtr container(Node::Kind kind) {
    NodePtr& c = top();
    if (c->kind != kind) fail("SETITEM or APPEND on the wrong kind of value");
    return c;
  }
  NodePtr scalar(Node::Kind kind) { return make(kind); }
  NodePtr integer(int64_t v) {
    NodePtr n = make(Node::Kind::kInt);
    n->i = v;
    return n;
  }
  NodePtr tuple(std::vector<NodePtr> items) {
    NodePtr n = make(Node::Kind::kList);
    n->items = std::move(items);
    return n;
  }
  void memo_put(uint64_t key) { memo_[key] = top(); }
  void memo_get(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) fail("a memo entry that was never put");
    push(it->second);
  }

  // One opcode; each *_op returns false for an opcode of another group.
  void step(uint8_t op);
  bool scalar_op(uint8_t op);
  bool memo_op(uint8_t op);
  bool container_op(uint8_t op);

  std::string_view data_;
  size_t pos_ = 0;
  std::vector<NodePtr> stack_;  // null: a MARK
  std::map<uint64_t, NodePtr> memo_;
};

void Reader::step(uint8_t op) {
  if (scalar_op(op) || memo_op(op) || container_op(op)) return;
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", op);
  fail(std::string("unsupported pickle opcode ") + hex);
}

// PROTO and FRAME, and the opcodes that push one value (None, bools, numbers, strings).
bool Reader::scalar_op(uint8_t op) {
  switch (op) {
    case 0x80:
      byte();
      break;  // PROTO
    case 0x95:
      little(8);
      break;  // FRAME
    case 'N':
      push(scalar(Node::Kind::kNone));
      break;  // NONE
    case 0x88:
    case 0x89: {  // NEWTRUE, NEWFALSE
      NodePtr n = make(Node::Kind::kBool);
      n->b = op == 0x88;
      push(n);
      break;
    }
    case 'J':
      push(integer(static_cast<int32_t>(little(4))));
      break;  // BININT
    case 'K':
      push(integer(static_cast<int64_t>(little(1))));
      break;  // BININT1
    case 'M':
      push(integer(static_cast<int64_t>(little(2))));
      break;      // BININT2
    case 0x8a: {  // LONG1
      const size_t n = byte();
      if (n > 8) fail("an integer wider than 64 bits");
      uint64_t v = little(n);
      if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign
      push(integer(static_cast<int64_t>(v)));
      break;
    }
    case 'G': {  // BINFLOAT: big-endian IEEE double
      uint64_t bits = 0;
      for (int k = 0; k < 8; ++k) bits = bits << 8 | byte();
      NodePtr n = make(Node::Kind::kFloat);
      std::memcpy(&n->f, &bits, sizeof bits);
      push(n);
      break;
    }
    case 'X':
    case 0x8c: {  // BINUNICODE (4-byte length), SHORT_BINUNICODE (1-byte)
      const size_t n = op == 'X' ? little(4) : byte();
      NodePtr s = make(Node::Kind::kString);
      s->s = text(n);
      push(s);
      break;
    }
    default:
      return false;
  }
  return true;
}

// The memo: values put aside by index and pushed again.
bool Reader::memo_op(uint8_t op) {
  switch (op) {
    case 'q':
      memo_put(byte());
      break;  // BINPUT
    case 'r':
      memo_put(little(4));
      break;  // LONG_BINPUT
    case 0x94:
      memo_put(memo_.size());
      break;  // MEMOIZE
    case 'h':
      memo_get(byte());
      break;  // BINGET
    case 'j':
      memo_get(little(4));
      break;  // LONG_BINGET
    default:
      return false;
  }
  return true;
}

// MARK, tuples, lists and dicts.
bool Reader::container_op(uint8_t op) {
  switch (op) {
    case '(':
      stack_.push_back(nullptr);
      break;  // MARK
    case '}':
      push(make(Node::Kind::kDict));
      break;  // EMPTY_DICT
    case ']':
      push(make(Node::Kind::kList));
      break;  // EMPTY_LIST
    case ')':
      push(tuple({}));
      break;  // EMPTY_TUPLE
    case 0x85:
      push(tuple({pop()}));
      break;      // TUPLE1
    case 0x86: {  // TUPLE2
      NodePtr b = pop(), a = pop();
      push(tuple({a, b}));
      break;
    }
    case 0x87: {  // TUPLE3
      NodePtr c = pop(), b = pop(), a = pop();
      push(tuple({a, b, c}));
      break;
    }
    case 't':
      push(tuple(since_mark()));
      break;     // TUPLE
    case 'a': {  // APPEND
      NodePtr v = pop();
      container(Node::Kind::kList)->items.push_back(v);
      break;
    }
    case 'e': {  // APPENDS
      auto items = since_mark();
      auto& list = container(Node::Kind::kList)->items;
      list.insert(list.end(), items.begin(), items.end());
      break;
    }
    case 's': {  // SETITEM
      NodePtr v = pop(), k = pop();
      container(Node::Kind::kDict)->entries.emplace_back(k, v);
      break;
    }
    case 'u': {  // SETITEMS
      auto items = since_mark();
      if (items.size() % 2) fail("SETITEMS with an odd number of values");
      auto& dict = container(Node::Kind::kDict)->entries;
      for (size_t k = 0; k < items.size(); k += 2) dict.emplace_back(items[k], items[k + 1]);
      break;
    }
    default:
      return false;
  }
  return true;
}

}  // namespace

std::optional<nlohmann::json> read_pickle(std::string_view data, std::string* error) {
  try {
    Reader reader(data);
    NodePtr root = reader.run();
    return to_json(*root, 0);
  } catch (const std::exception& e) {
    if (error) *error = std::string("not a readable pickle: ") + e.what();
    return std::nullopt;
  }
}

}  // namespace ddprun::agent
