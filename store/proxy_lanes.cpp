// StoreProxy::Impl (proxy_impl.hpp): sending a lane's gathered group upstream as one request and
// answering each of its members from the one reply.
#include <limits>
#include <string>

#include "store/proxy_impl.hpp"
#include "store/wire.hpp"

namespace ddprun::store {

using proxy::Shape;

namespace {

std::string i64_bytes(int64_t v) {
  std::string s;
  wire::put_i64(s, v);
  return s;
}

}  // namespace

std::shared_ptr<StoreProxy::Impl::Group> StoreProxy::Impl::take_next(Kind kind,
                                                                     const std::string& lane_key) {
  auto it = lanes_[kind].find(lane_key);
  if (it == lanes_[kind].end()) return nullptr;
  Lane& lane = it->second;
  if (lane.in_flight || !lane.next) return nullptr;
  lane.in_flight = std::move(lane.next);
  stats_.coalesced += lane.in_flight->members.size() - 1;
  return lane.in_flight;
}

void StoreProxy::Impl::unblock(const Group& group) {
  for (const Member& m : group.members) {
    if (auto c = m.client.lock()) c->unblock();
  }
}

void StoreProxy::Impl::emit(Kind kind, const std::string& lane_key) {
  std::shared_ptr<Group> group = take_next(kind, lane_key);
  if (!group) return;
  std::string frame;
  switch (kind) {
    case kAdd:
      emit_add(lane_key, group);
      return;  // its members wait for the reply
    case kSet:
      if (group->keys.size() == 1) {
        wire::put_u8(frame, torch2_opcode(Op::kSet));
        wire::put_bytes(frame, group->keys[0]);
        wire::put_bytes(frame, group->values[0]);
      } else {
        wire::put_u8(frame, torch2_opcode(Op::kMultiSet));
        wire::put_i64(frame, static_cast<int64_t>(group->keys.size()));
        for (size_t i = 0; i < group->keys.size(); ++i) {
          wire::put_bytes(frame, group->keys[i]);
          wire::put_bytes(frame, group->values[i]);
        }
      }
      upstream_->send(std::move(frame));
      finished(kSet, lane_key, group);  // nothing to wait for
      break;
    case kGet:   // emit_gets
    case kWait:  // emit_waits
    case kKinds:
      return;
  }
  // Sent: the members' later requests may go (the store sees them after this one).
  unblock(*group);
}

// The GET groups of one turn as one GET or MULTI_GET, each group answered from its value.
void StoreProxy::Impl::emit_gets(std::vector<std::pair<std::string, std::shared_ptr<Group>>> gets) {
  std::string frame;
  if (gets.size() == 1) {
    wire::put_u8(frame, torch2_opcode(Op::kGet));
    wire::put_bytes(frame, gets[0].first);
  } else {
    wire::put_u8(frame, torch2_opcode(Op::kMultiGet));
    wire::put_u64(frame, gets.size());
    for (const auto& get : gets) wire::put_bytes(frame, get.first);
  }
  const size_t count = gets.size();
  upstream_->send(std::move(frame), count == 1 ? Shape::kBytes : Shape::kValues, count,
                  [self = weak_from_this(), gets](std::string_view reply, bool) {
                    size_t at = 0;
                    for (const auto& [lane, group] : gets) {
                      const size_t end =
                          at + proxy::reply_length(Shape::kBytes, 0, reply.substr(at));
                      for (const Member& m : group->members)
                        m.slot->fill(reply.substr(at, end - at));
                      at = end;
                      if (auto s = self.lock()) s->finished(kGet, lane, group);
                    }
                  });
  for (const auto& get : gets) unblock(*get.second);
}

// The WAIT groups of one turn as one WAIT_TAGGED or MULTI_WAIT_TAGGED (consecutive tags), as
// many as one request may carry keys; each group is answered by its tag's release.
void StoreProxy::Impl::emit_waits(
    std::vector<std::pair<std::string, std::shared_ptr<Group>>> waits) {
  const size_t max_keys = Limits().max_keys;
  size_t first = 0;
  while (first < waits.size()) {
    size_t end = first;
    size_t keys = 0;
    while (end < waits.size() &&
           (end == first || keys + waits[end].second->keys.size() <= max_keys)) {
      keys += waits[end++].second->keys.size();
    }
    const uint32_t tag = next_tag_;
    next_tag_ += static_cast<uint32_t>(end - first);
    std::string frame;
    wire::put_u8(frame, end - first == 1 ? kWaitTaggedOpcode : kMultiWaitTaggedOpcode);
    wire::put_u32(frame, tag);
    wire::put_u64(frame, keys);
    std::string counts;
    for (size_t i = first; i < end; ++i) {
      const Group& group = *waits[i].second;
      tagged_[tag + static_cast<uint32_t>(i - first)] = Tagged{waits[i].first, waits[i].second};
      for (const std::string& k : group.keys) wire::put_bytes(frame, k);
      wire::put_u32(counts, static_cast<uint32_t>(group.keys.size()));
    }
    if (end - first > 1) wire::put_bytes(frame, counts);
    upstream_->send(std::move(frame));
    first = end;
  }
  for (const auto& wait : waits) unblock(*wait.second);
}

// N ADDs as one ADD of their sum (as many as fit in an i64; the rest gather for the next).
void StoreProxy::Impl::emit_add(const std::string& lane_key, const std::shared_ptr<Group>& group) {
  int64_t sum = 0;
  size_t fit = 0;
  for (; fit < group->members.size(); ++fit) {
    int64_t next = 0;
    if (__builtin_add_overflow(sum, group->members[fit].delta, &next)) break;
    sum = next;
  }
  if (fit < group->members.size()) {
    Lane& lane = lanes_[kAdd][lane_key];
    auto rest = std::make_shared<Group>();
    rest->keys = group->keys;
    rest->members.assign(group->members.begin() + static_cast<std::ptrdiff_t>(fit),
                         group->members.end());
    group->members.resize(fit);
    if (lane.next) {
      rest->members.insert(rest->members.end(), lane.next->members.begin(),
                           lane.next->members.end());
    }
    lane.next = rest;
  }
  std::string frame;
  wire::put_u8(frame, torch2_opcode(Op::kAdd));
  wire::put_bytes(frame, lane_key);
  wire::put_i64(frame, sum);
  upstream_->send(
      std::move(frame), Shape::kI64, 0,
      [self = weak_from_this(), lane_key, group, sum](std::string_view reply, bool failed) {
        if (auto s = self.lock()) s->add_replied(lane_key, group, sum, reply, failed);
      });
}

// Each member gets the value it would have seen had the ADDs run one after another, in the order
// they reached the proxy. A refused group of several is asked again one by one (the store is
// unchanged by a refused ADD): only the ADDs the store refuses alone close their clients.
void StoreProxy::Impl::add_replied(const std::string& lane_key, const std::shared_ptr<Group>& group,
                                   int64_t sum, std::string_view reply, bool failed) {
  if (!failed) {
    int64_t value = static_cast<int64_t>(wire::load_le(reply.data(), 8)) - sum;
    for (const Member& m : group->members) {
      value += m.delta;
      m.slot->fill(i64_bytes(value));
      if (auto c = m.client.lock()) c->unblock();
    }
  } else if (group->members.size() == 1) {
    if (auto c = group->members[0].client.lock()) c->close(std::string(reply));
  } else {
    for (const Member& m : group->members) {
      std::string frame;
      wire::put_u8(frame, torch2_opcode(Op::kAdd));
      wire::put_bytes(frame, lane_key);
      wire::put_i64(frame, m.delta);
      upstream_->send(std::move(frame), Shape::kI64, 0, [m](std::string_view one, bool refused) {
        auto c = m.client.lock();
        if (refused) {
          if (c) c->close(std::string(one));
          return;
        }
        m.slot->fill(one);
        if (c) c->unblock();
      });
    }
    schedule_flush();
  }
  finished(kAdd, lane_key, group);
}

void StoreProxy::Impl::released(uint32_t tag) {
  auto it = tagged_.find(tag);
  if (it == tagged_.end()) return;  // cancelled meanwhile
  Tagged t = std::move(it->second);
  tagged_.erase(it);
  for (const Member& m : t.group->members) {
    if (auto c = m.client.lock()) {
      auto& w = c->pending_wait();
      if (w && w->slot == m.slot) w.reset();
    }
    m.slot->fill(std::string(1, static_cast<char>(kStopWaiting)));
  }
  if (!t.lane.empty()) finished(kWait, t.lane, t.group);
}

// The lane's request in flight was answered: its next group may go; an idle lane is dropped.
void StoreProxy::Impl::finished(Kind kind, const std::string& lane_key,
                                const std::shared_ptr<Group>& group) {
  auto it = lanes_[kind].find(lane_key);
  if (it == lanes_[kind].end() || it->second.in_flight != group) return;
  it->second.in_flight.reset();
  if (it->second.next) {
    dirty_.emplace_back(kind, lane_key);
    schedule_flush();
  } else {
    lanes_[kind].erase(it);
  }
}

}  // namespace ddprun::store
