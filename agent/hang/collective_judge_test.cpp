// The collective judgement on flight-recorder dumps in torch 2.15's JSON form (trimmed from
// real gloo dumps of a job whose rank 1 skipped an all_reduce) and on stacks alone.
#include "agent/hang/collective_judge.hpp"

#include <gtest/gtest.h>

namespace ddprun::agent {
namespace {

std::string entry(int seq, const char* name, int64_t numel, bool retired) {
  return R"({"collective_seq_id": )" + std::to_string(seq) +
         R"(, "input_dtypes": ["Float"], "input_sizes": [[)" + std::to_string(numel) +
         R"(]], "is_p2p": false, "op_id": )" + std::to_string(seq) +
         R"(, "output_dtypes": ["Float"], "output_sizes": [[1000]], "p2p_seq_id": 0, "pg_id": 0,
         "process_group": ["0", "default_pg"], "profiling_name": "gloo:)" +
         name + R"(", "record_id": 0, "retired": )" + (retired ? "true" : "false") +
         R"(, "state": "scheduled", "time_created_ns": 1795731213000000000, "timeout_ms": 4000})";
}

std::string dump(int enqueued, int completed, const std::string& entries) {
  return R"({"comm_lib_version": "", "entries": [)" + entries +
         R"(], "nccl_comm_state": {}, "pg_config": {"": {"desc": "", "name": "", "ranks": "[0, 1]"}},
         "pg_status": {"0": {"last_completed_collective": ")" +
         std::to_string(completed) + R"(", "last_enqueued_collective": ")" +
         std::to_string(enqueued) + R"(", "last_started_collective": "-1"}}, "version": "2.10"})";
}

const std::string kRank0 =
    dump(5, 4,
         entry(3, "all_reduce", 1000, true) + "," + entry(4, "broadcast", 1000, true) + "," +
             entry(5, "all_reduce", 6000000, false));
const std::string kRank1 =
    dump(4, 4, entry(3, "all_reduce", 1000, true) + "," + entry(4, "broadcast", 1000, true));

RankEvidence traced(int rank, const std::string& text) {
  RankEvidence r;
  r.rank = rank;
  r.host = "node" + std::to_string(rank);
  r.pid = 4000 + rank;
  std::string error;
  r.trace = parse_flight_recorder_json(text, &error);
  EXPECT_TRUE(r.trace) << error;
  return r;
}

TEST(CollectiveJudge, ParsesTorchsJsonDump) {
  std::string error;
  auto t = parse_flight_recorder_json(kRank0, &error);
  ASSERT_TRUE(t) << error;
  ASSERT_EQ(t->pgs.count("0"), 1u);
  const PgTrace& pg = t->pgs.at("0");
  EXPECT_EQ(pg.last_enqueued, 5);
  EXPECT_EQ(pg.last_completed, 4);
  ASSERT_EQ(pg.entries.size(), 3u);
  EXPECT_EQ(pg.entries[2].op, "all_reduce");
  EXPECT_EQ(pg.entries[2].bytes, 24000000);
  EXPECT_EQ(pg.entries[1].op, "broadcast");
}

TEST(CollectiveJudge, RefusesWhatIsNoDump) {
  std::string error;
  EXPECT_FALSE(parse_flight_recorder_json("{\"entries\": [", &error));
  EXPECT_EQ(error, "not JSON");
  EXPECT_FALSE(parse_flight_recorder_json("[1, 2]", &error));
  EXPECT_FALSE(parse_flight_recorder_json("{\"entries\": []}", &error));
  EXPECT_EQ(error, "no \"pg_status\" object");
  // Odd types are skipped, not trusted.
  auto t = parse_flight_recorder_json(
      R"({"pg_status": {"0": {"last_enqueued_collective": [], "last_completed_collective": "x"}},
          "entries": [7, {"collective_seq_id": "z"}, {"collective_seq_id": 2, "pg_id": 0,
          "input_sizes": "no", "profiling_name": 3}]})",
      &error);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->pgs.at("0").last_enqueued, -1);
  ASSERT_EQ(t->pgs.at("0").entries.size(), 1u);
  EXPECT_EQ(t->pgs.at("0").entries[0].bytes, 0);
}

TEST(CollectiveJudge, NamesTheRankThatNeverEnteredTheCollective) {
  auto v = judge_collective_hang({traced(0, kRank0), traced(1, kRank1)}, 2,
                                 1795731213000000000 + 3'100'000'000);
  EXPECT_TRUE(v.from_flight_recorder);
  EXPECT_EQ(v.seq, 5);
  EXPECT_EQ(v.op, "all_reduce");
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_EQ(v.waiting, std::vector<int>{0});
  EXPECT_EQ(v.line,
            "collective #5 all_reduce (24.0 MB, pg 0): rank 0 waiting 3.1 s; rank 1 (node1, pid "
            "4001) never entered it (its last: #4 broadcast)");
}

TEST(CollectiveJudge, RanksThatDisagreeOnTheCollectiveAreNamed) {
  const std::string other =
      dump(5, 4,
           entry(3, "all_reduce", 1000, true) + "," + entry(4, "broadcast", 1000, true) + "," +
               entry(5, "broadcast", 10, false));
  auto v = judge_collective_hang({traced(0, kRank0), traced(1, other)}, 2, 0);
  EXPECT_EQ(v.waiting, (std::vector<int>{0, 1}));
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_EQ(v.line,
            "collective #5 all_reduce (24.0 MB, pg 0): ranks 0-1 waiting; rank 1 entered it as "
            "broadcast (40 B); no rank was found outside it");
}

TEST(CollectiveJudge, ARankWithoutTraceIsPlacedByItsStack) {
  RankEvidence stuck;
  stuck.rank = 1;
  stuck.pid = 77;
  stuck.place = {StackPlace::Where::kElsewhere, "", "stuck (train.py:9)"};
  auto v = judge_collective_hang({traced(0, kRank0), stuck}, 2, 0);
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_EQ(v.line,
            "collective #5 all_reduce (24.0 MB, pg 0): rank 0 waiting; rank 1 (pid 77) is not in "
            "a collective (no flight recorder; its stack: stuck (train.py:9))");
}

TEST(CollectiveJudge, StacksAloneWhenNoRankHasATrace) {
  RankEvidence a, b, c;
  a.rank = 0, a.pid = 10;
  a.place = {StackPlace::Where::kInCollective, "all_reduce",
             "all_reduce (x/distributed_c10d.py:1)"};
  b.rank = 2, b.pid = 12;
  b.place = a.place;
  c.rank = 1, c.pid = 11, c.host = "h";
  c.place = {StackPlace::Where::kElsewhere, "", "#0 clock_nanosleep"};
  auto v = judge_collective_hang({a, b, c}, 3, 0);
  EXPECT_FALSE(v.from_flight_recorder);
  EXPECT_EQ(v.line,
            "ranks 0,2 wait in a collective (all_reduce) (no flight recorder of it); rank 1 "
            "(h, pid 11) is not in one (its stack: #0 clock_nanosleep)");
  // Every local rank waits and the job has more: the culprit is on another node.
  v = judge_collective_hang({a, b}, 4, 0);
  EXPECT_EQ(v.line,
            "ranks 0,2 wait in a collective (all_reduce) (no flight recorder of it); the "
            "rank(s) they wait for are not on this node");
}

TEST(CollectiveJudge, ARankThatTimedOutWaitsAndATraceWithNothingInFlightIsElsewhere) {
  // Rank 0 died of its collective's timeout (no trace left); rank 1's trace has nothing in
  // flight.
  RankEvidence dead;
  dead.rank = 0, dead.pid = 10;
  dead.place = {StackPlace::Where::kInCollective, "", "Timed out waiting 4000ms for recv"};
  auto v = judge_collective_hang({dead, traced(1, kRank1)}, 2, 0);
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_EQ(v.line,
            "rank 0 waits in a collective (no flight recorder of it); rank 1 (node1, pid 4001) is "
            "not in one (its flight recorder's last: #4 broadcast)");
}

TEST(CollectiveJudge, ARankThatTimedOutWaitedInItsLastCollectiveWhateverItsTraceSays) {
  // torch marked the failed all_reduce completed before it dumped rank 0's recorder.
  const std::string done =
      dump(5, 5, entry(4, "broadcast", 1000, true) + "," + entry(5, "all_reduce", 6000000, true));
  RankEvidence dead = traced(0, done);
  dead.timed_out = true;
  auto v = judge_collective_hang({dead, traced(1, kRank1)}, 2, 0);
  EXPECT_EQ(v.seq, 5);
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_EQ(v.line,
            "collective #5 all_reduce (24.0 MB, pg 0): rank 0 waiting; rank 1 (node1, pid 4001) "
            "never entered it (its last: #4 broadcast)");
  // Without the timeout, that trace is a rank outside any collective: no verdict.
  dead.timed_out = false;
  EXPECT_EQ(judge_collective_hang({dead, traced(1, kRank1)}, 2, 0).line, "");
  // The flag travels between nodes.
  dead.timed_out = true;
  EXPECT_TRUE(decode_evidence(encode_evidence({dead})).at(0).timed_out);
}

TEST(CollectiveJudge, ARankWithNoEvidenceIsSaidToBeUnknown) {
  RankEvidence silent;
  silent.rank = 1;
  silent.pid = 77;
  auto v = judge_collective_hang({traced(0, kRank0), silent}, 2, 0);
  EXPECT_TRUE(v.culprits.empty());
  EXPECT_EQ(v.line,
            "collective #5 all_reduce (24.0 MB, pg 0): rank 0 waiting; rank 1: no flight "
            "recorder and no stacks to tell");
}

TEST(CollectiveJudge, NothingInFlightIsNoVerdict) {
  EXPECT_EQ(judge_collective_hang({traced(1, kRank1)}, 2, 0).line, "");
  EXPECT_EQ(judge_collective_hang({}, 2, 0).line, "");
}

TEST(CollectiveJudge, RankRanges) {
  EXPECT_EQ(rank_ranges({7, 0, 1, 2, 4, 6, 2}), "0-2,4,6-7");
  EXPECT_EQ(rank_ranges({}), "");
}

TEST(CollectiveJudge, EvidenceTravelsBetweenNodesAndJudgesTheSame) {
  RankEvidence stuck;
  stuck.rank = 1;
  stuck.host = "node1";
  stuck.pid = 77;
  stuck.place = {StackPlace::Where::kElsewhere, "", "stuck (train.py:9)"};
  stuck.trace = traced(1, kRank1).trace;
  const std::vector<RankEvidence> node0{traced(0, kRank0)}, node1{stuck};
  std::vector<RankEvidence> all;
  for (const auto& part : {encode_evidence(node0), encode_evidence(node1)}) {
    for (auto& r : decode_evidence(part)) all.push_back(std::move(r));
  }
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1].place.frame, "stuck (train.py:9)");
  // Only the entries from the last completed one on travel.
  EXPECT_EQ(all[0].trace->pgs.at("0").entries.size(), 2u);
  auto v = judge_collective_hang(all, 2, 0);
  EXPECT_EQ(v.line,
            "collective #5 all_reduce (24.0 MB, pg 0): rank 0 waiting; rank 1 (node1, pid 77) "
            "never entered it (its last: #4 broadcast)");
  EXPECT_TRUE(decode_evidence("not json").empty());
  EXPECT_TRUE(decode_evidence(R"([1, {"rank": "x"}, {"host": "h"}])").empty());
}

}  // namespace
}  // namespace ddprun::agent
