// judge_collective_hang (collective_judge.hpp): every rank's evidence of a hung job judged into
// one verdict. Reading flight recorder dumps and the shared evidence: rank_evidence.cpp.
#include "agent/hang/collective_judge.hpp"

#include <algorithm>
#include <cstdio>
#include <set>

namespace ddprun::agent {

namespace {

std::string size_text(int64_t bytes) {
  char buf[32];
  if (bytes < 1000) {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  } else if (bytes < 1000 * 1000) {
    std::snprintf(buf, sizeof buf, "%.1f kB", static_cast<double>(bytes) / 1e3);
  } else if (bytes < 1000LL * 1000 * 1000) {
    std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f GB", static_cast<double>(bytes) / 1e9);
  }
  return buf;
}

std::string seconds_since(int64_t then_ns, int64_t now_ns) {
  if (then_ns <= 0 || now_ns <= then_ns) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, " %.1f s", static_cast<double>(now_ns - then_ns) / 1e9);
  return buf;
}

std::string ranks_word(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rank_ranges(ranks);
}

std::string who(const RankEvidence& r) {
  std::string s = "rank " + std::to_string(r.rank) + " (";
  if (!r.host.empty()) s += r.host + ", ";
  return s + "pid " + std::to_string(r.pid) + ")";
}

struct Stuck {
  std::string pg;
  int64_t seq = -1;
};

// The process group with a collective some rank enqueued and did not complete, and the lowest
// such sequence number in it (the default group "0" first, then by id).
std::optional<Stuck> find_stuck(const std::vector<RankEvidence>& ranks) {
  std::set<std::string> ids;
  for (const auto& r : ranks) {
    if (!r.trace) continue;
    for (const auto& [id, pg] : r.trace->pgs) ids.insert(id);
  }
  std::vector<std::string> order(ids.begin(), ids.end());
  std::stable_partition(order.begin(), order.end(),
                        [](const std::string& id) { return id == "0"; });
  for (const auto& id : order) {
    int64_t seq = -1;
    for (const auto& r : ranks) {
      if (!r.trace) continue;
      auto it = r.trace->pgs.find(id);
      if (it == r.trace->pgs.end()) continue;
      const PgTrace& pg = it->second;
      if (pg.last_enqueued > pg.last_completed) {
        const int64_t s = pg.last_completed + 1;
        if (seq < 0 || s < seq) seq = s;
      }
    }
    if (seq >= 0) return Stuck{id, seq};
  }
  return std::nullopt;
}

}  // namespace

std::string rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

namespace {

// A rank that died of its collective's timeout waited in its most recent collective (the group
// whose last enqueued one was created last): that one counts as not completed.
std::vector<RankEvidence> with_timeouts_in_flight(const std::vector<RankEvidence>& ranks) {
  std::vector<RankEvidence> out = ranks;
  for (auto& r : out) {
    if (!r.timed_out || !r.trace) continue;
    PgTrace* latest = nullptr;
    int64_t latest_ns = -1;
    for (auto& [id, pg] : r.trace->pgs) {
      const TraceEntry* e = pg.find(pg.last_enqueued);
      if (e && e->created_ns > latest_ns) {
        latest = &pg;
        latest_ns = e->created_ns;
      }
    }
    if (latest && latest->last_completed >= latest->last_enqueued) {
      latest->last_completed = latest->last_enqueued - 1;
    }
  }
  return out;
}

}  // namespace

CollectiveVerdict judge_collective_hang(const std::vector<RankEvidence>& evidence, int world_size,
                                        int64_t now_ns) {
  const std::vector<RankEvidence> ranks = with_timeouts_in_flight(evidence);
  CollectiveVerdict v;
  std::vector<std::string> parts;
  std::vector<const RankEvidence*> traceless;
  for (const auto& r : ranks) {
    if (!r.trace) traceless.push_back(&r);
  }

  if (auto stuck = find_stuck(ranks)) {
    v.from_flight_recorder = true;
    v.seq = stuck->seq;
    v.pg = stuck->pg;
    const TraceEntry* entry = nullptr;
    std::vector<std::string> never, disagree;
    for (const auto& r : ranks) {
      if (!r.trace) continue;
      auto it = r.trace->pgs.find(stuck->pg);
      if (it == r.trace->pgs.end()) continue;  // not a member of that group
      const PgTrace& pg = it->second;
      if (pg.last_enqueued >= stuck->seq && pg.last_completed < stuck->seq) {
        v.waiting.push_back(r.rank);
        const TraceEntry* mine = pg.find(stuck->seq);
        if (!mine) continue;
        if (!entry) {
          entry = mine;
        } else if (mine->op != entry->op || mine->bytes != entry->bytes) {
          disagree.push_back("rank " + std::to_string(r.rank) + " entered it as " + mine->op +
                             " (" + size_text(mine->bytes) + ")");
        }
      } else if (pg.last_enqueued < stuck->seq) {
        v.culprits.push_back(r.rank);
        std::string last = "none";
        if (pg.last_enqueued >= 0) {
          last = "#" + std::to_string(pg.last_enqueued);
          if (const TraceEntry* e = pg.find(pg.last_enqueued)) last += " " + e->op;
        }
        never.push_back(who(r) + " never entered it (its last: " + last + ")");
      }
    }
    // Ranks without a trace, placed by their stacks.
    for (const RankEvidence* r : traceless) {
      if (r->place.where == StackPlace::Where::kInCollective) {
        v.waiting.push_back(r->rank);
      } else if (r->place.where == StackPlace::Where::kElsewhere) {
        v.culprits.push_back(r->rank);
        never.push_back(who(*r) + " is not in a collective (no flight recorder; its stack: " +
                        r->place.frame + ")");
      }
    }
    std::string head = "collective #" + std::to_string(stuck->seq);
    if (entry) {
      v.op = entry->op;
      head += " " + entry->op + " (" + size_text(entry->bytes) + ", pg " + stuck->pg + ")";
    } else {
      head += " (pg " + stuck->pg + ")";
    }
    std::string waiting = ranks_word(v.waiting) + " waiting" +
                          (entry ? seconds_since(entry->created_ns, now_ns) : std::string());
    parts.push_back(head + ": " + waiting);
    for (auto& n : never) parts.push_back(std::move(n));
    for (auto& d : disagree) parts.push_back(std::move(d));
  } else {
    // No flight recorder shows a collective in flight: the stacks (and failures) place the
    // ranks without one; a rank whose flight recorder shows nothing in flight is in none.
    std::vector<std::string> elsewhere;
    std::string op;
    for (const auto& r : ranks) {
      if (!r.trace) continue;
      std::string last = "none";
      for (const auto& [id, pg] : r.trace->pgs) {
        if (id != "0" || pg.last_enqueued < 0) continue;
        last = "#" + std::to_string(pg.last_enqueued);
        if (const TraceEntry* e = pg.find(pg.last_enqueued)) last += " " + e->op;
      }
      v.culprits.push_back(r.rank);
      elsewhere.push_back(who(r) + " is not in one (its flight recorder's last: " + last + ")");
    }
    for (const RankEvidence* r : traceless) {
      if (r->place.where == StackPlace::Where::kInCollective) {
        v.waiting.push_back(r->rank);
        if (op.empty()) op = r->place.op;
      } else if (r->place.where == StackPlace::Where::kElsewhere) {
        v.culprits.push_back(r->rank);
        elsewhere.push_back(who(*r) + " is not in one (its stack: " + r->place.frame + ")");
      }
    }
    if (v.waiting.empty()) return CollectiveVerdict{};
    v.op = op;
    parts.push_back(ranks_word(v.waiting) + (v.waiting.size() == 1 ? " waits" : " wait") +
                    " in a collective" + (op.empty() ? std::string() : " (" + op + ")") +
                    " (no flight recorder of it)");
    for (auto& e : elsewhere) parts.push_back(std::move(e));
  }
  std::vector<int> unknown;  // neither a trace nor stacks
  for (const RankEvidence* r : traceless) {
    if (r->place.where == StackPlace::Where::kUnknown) unknown.push_back(r->rank);
  }
  if (!unknown.empty()) {
    parts.push_back(ranks_word(unknown) + ": no flight recorder and no stacks to tell");
  }
  if (v.culprits.empty() && unknown.empty()) {
    const int examined = static_cast<int>(ranks.size());
    parts.push_back(world_size > examined ? "the rank(s) they wait for are not on this node"
                                          : "no rank was found outside it");
  }
  for (size_t i = 0; i < parts.size(); ++i) v.line += (i ? "; " : "") + parts[i];
  return v;
}

}  // namespace ddprun::agent
