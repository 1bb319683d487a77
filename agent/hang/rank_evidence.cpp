// What the agent learns of each rank of a hung job: torch's flight recorder dumps (JSON or
// pickle) read into a RankTrace, and the evidence every agent shares in the store, encoded
// and decoded (collective_judge.hpp).
#include <nlohmann/json.hpp>

#include "agent/hang/collective_judge.hpp"
#include "agent/hang/fr_pickle.hpp"

namespace ddprun::agent {

namespace {

using nlohmann::json;

// A JSON value torch writes as a number or as a string of one ("5"); nullopt for anything else.
std::optional<int64_t> as_int(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_unsigned()) return static_cast<int64_t>(v.get<uint64_t>());
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    char* end = nullptr;
    long long n = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end && *end == '\0') return n;
  }
  return std::nullopt;
}

int64_t dtype_bytes(std::string_view dtype) {
  if (dtype == "Double" || dtype == "Long" || dtype == "ComplexFloat") return 8;
  if (dtype == "Half" || dtype == "BFloat16" || dtype == "Short") return 2;
  if (dtype == "Byte" || dtype == "Char" || dtype == "Bool" || dtype.starts_with("Float8")) {
    return 1;
  }
  if (dtype == "ComplexDouble") return 16;
  return 4;  // Float, Int, and what we do not know
}

int64_t input_bytes(const json& e) {
  auto sizes = e.find("input_sizes");
  auto dtypes = e.find("input_dtypes");
  if (sizes == e.end() || !sizes->is_array()) return 0;
  int64_t total = 0;
  for (size_t i = 0; i < sizes->size(); ++i) {
    const json& shape = (*sizes)[i];
    if (!shape.is_array()) continue;
    int64_t n = 1;
    for (const json& d : shape) n *= as_int(d).value_or(0);
    std::string dtype = "Float";
    if (dtypes != e.end() && dtypes->is_array() && i < dtypes->size() && (*dtypes)[i].is_string()) {
      dtype = (*dtypes)[i].get<std::string>();
    }
    total += n * dtype_bytes(dtype);
  }
  return total;
}

std::string pg_of(const json& e) {
  if (auto pg = e.find("process_group"); pg != e.end() && pg->is_array() && !pg->empty()) {
    if ((*pg)[0].is_string()) return (*pg)[0].get<std::string>();
  }
  if (auto id = e.find("pg_id"); id != e.end()) {
    if (auto n = as_int(*id)) return std::to_string(*n);
  }
  return "";
}

}  // namespace

const TraceEntry* PgTrace::find(int64_t seq) const {
  for (const auto& e : entries) {
    if (e.seq == seq) return &e;
  }
  return nullptr;
}

namespace {

std::optional<RankTrace> flight_recorder_of(const json& doc, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<RankTrace> {
    if (error) *error = why;
    return std::nullopt;
  };
  if (!doc.is_object()) return fail("not a JSON object");
  auto status = doc.find("pg_status");
  auto entries = doc.find("entries");
  if (status == doc.end() || !status->is_object()) return fail("no \"pg_status\" object");
  RankTrace trace;
  for (const auto& [id, s] : status->items()) {
    if (!s.is_object()) continue;
    PgTrace& pg = trace.pgs[id];
    if (auto v = s.find("last_enqueued_collective"); v != s.end()) {
      pg.last_enqueued = as_int(*v).value_or(-1);
    }
    if (auto v = s.find("last_completed_collective"); v != s.end()) {
      pg.last_completed = as_int(*v).value_or(-1);
    }
  }
  if (entries != doc.end() && entries->is_array()) {
    for (const json& e : *entries) {
      if (!e.is_object()) continue;
      if (auto p2p = e.find("is_p2p"); p2p != e.end() && p2p->is_boolean() && p2p->get<bool>()) {
        continue;
      }
      auto seq = e.find("collective_seq_id");
      if (seq == e.end() || !as_int(*seq)) continue;
      TraceEntry t;
      t.seq = *as_int(*seq);
      if (auto name = e.find("profiling_name"); name != e.end() && name->is_string()) {
        t.op = name->get<std::string>();
        if (auto colon = t.op.rfind(':'); colon != std::string::npos) t.op.erase(0, colon + 1);
      }
      t.bytes = input_bytes(e);
      if (auto c = e.find("time_created_ns"); c != e.end()) t.created_ns = as_int(*c).value_or(0);
      trace.pgs[pg_of(e)].entries.push_back(std::move(t));
    }
  }
  trace.pgs.erase("");  // entries whose group we could not tell
  return trace;
}

}  // namespace

std::optional<RankTrace> parse_flight_recorder_json(std::string_view text, std::string* error) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    if (error) *error = "not JSON";
    return std::nullopt;
  }
  return flight_recorder_of(doc, error);
}

std::optional<RankTrace> parse_flight_recorder_pickle(std::string_view data, std::string* error) {
  auto doc = read_pickle(data, error);
  if (!doc) return std::nullopt;
  return flight_recorder_of(*doc, error);
}

namespace {

const char* where_name(StackPlace::Where w) {
  switch (w) {
    case StackPlace::Where::kInCollective:
      return "in_collective";
    case StackPlace::Where::kElsewhere:
      return "elsewhere";
    case StackPlace::Where::kUnknown:
      break;
  }
  return "unknown";
}

StackPlace::Where where_of(const std::string& name) {
  if (name == "in_collective") return StackPlace::Where::kInCollective;
  if (name == "elsewhere") return StackPlace::Where::kElsewhere;
  return StackPlace::Where::kUnknown;
}

std::string text_of(const json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::string encode_evidence(const std::vector<RankEvidence>& ranks) {
  json out = json::array();
  for (const auto& r : ranks) {
    json item = {
        {"rank", r.rank},
        {"host", r.host},
        {"pid", r.pid},
        {"timed_out", r.timed_out},
        {"place",
         {{"where", where_name(r.place.where)}, {"op", r.place.op}, {"frame", r.place.frame}}}};
    if (r.trace) {
      json pgs = json::object();
      for (const auto& [id, pg] : r.trace->pgs) {
        json entries = json::array();
        for (const auto& e : pg.entries) {
          if (e.seq < pg.last_completed) continue;
          entries.push_back(
              {{"seq", e.seq}, {"op", e.op}, {"bytes", e.bytes}, {"t", e.created_ns}});
        }
        while (entries.size() > kSharedEntries) entries.erase(entries.begin());
        pgs[id] = {{"e", pg.last_enqueued}, {"c", pg.last_completed}, {"entries", entries}};
      }
      item["trace"] = pgs;
    }
    out.push_back(std::move(item));
  }
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::vector<RankEvidence> decode_evidence(std::string_view text) {
  std::vector<RankEvidence> ranks;
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_array()) return ranks;
  for (const json& item : doc) {
    if (!item.is_object() || !item.contains("rank") || !as_int(item["rank"])) continue;
    RankEvidence r;
    r.rank = static_cast<int>(*as_int(item["rank"]));
    r.host = text_of(item, "host");
    if (auto pid = item.find("pid"); pid != item.end()) {
      r.pid = static_cast<pid_t>(as_int(*pid).value_or(0));
    }
    if (auto t = item.find("timed_out"); t != item.end() && t->is_boolean()) {
      r.timed_out = t->get<bool>();
    }
    if (auto place = item.find("place"); place != item.end() && place->is_object()) {
      r.place.where = where_of(text_of(*place, "where"));
      r.place.op = text_of(*place, "op");
      r.place.frame = text_of(*place, "frame");
    }
    if (auto trace = item.find("trace"); trace != item.end() && trace->is_object()) {
      RankTrace t;
      for (const auto& [id, pg] : trace->items()) {
        if (!pg.is_object()) continue;
        PgTrace& p = t.pgs[id];
        if (auto e = pg.find("e"); e != pg.end()) p.last_enqueued = as_int(*e).value_or(-1);
        if (auto c = pg.find("c"); c != pg.end()) p.last_completed = as_int(*c).value_or(-1);
        auto entries = pg.find("entries");
        if (entries == pg.end() || !entries->is_array()) continue;
        for (const json& e : *entries) {
          if (!e.is_object() || !e.contains("seq") || !as_int(e["seq"])) continue;
          TraceEntry te;
          te.seq = *as_int(e["seq"]);
          te.op = text_of(e, "op");
          if (auto b = e.find("bytes"); b != e.end()) te.bytes = as_int(*b).value_or(0);
          if (auto c = e.find("t"); c != e.end()) te.created_ns = as_int(*c).value_or(0);
          p.entries.push_back(std::move(te));
        }
      }
      r.trace = std::move(t);
    }
    ranks.push_back(std::move(r));
  }
  return ranks;
}

}  // namespace ddprun::agent
