#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddprun/process_group.hpp"
#include "test_ranks.hpp"

namespace ddprun {
namespace {

using testing::errors_of_ranks;
using testing::run_ranks;

TEST(Collectives, AllReduceOps) {
  run_ranks(3, [](int rank, ProcessGroup& pg) {
    EXPECT_EQ(pg.size(), 3);
    EXPECT_EQ(pg.rank(), rank);
    EXPECT_EQ(pg.backend_name(), "gloo");
    auto t = torch::full({4}, static_cast<float>(rank + 1));
    pg.all_reduce(t);
    EXPECT_TRUE(torch::equal(t, torch::full({4}, 6.0f)));
    t = torch::full({2}, static_cast<float>(rank + 1));
    pg.all_reduce(t, ReduceOp::kAvg);
    EXPECT_TRUE(torch::allclose(t, torch::full({2}, 2.0f)));
    auto m = torch::tensor({static_cast<int64_t>(rank), static_cast<int64_t>(-rank)});
    pg.all_reduce(m, ReduceOp::kMax);
    EXPECT_EQ(m[0].item<int64_t>(), 2);
    EXPECT_EQ(m[1].item<int64_t>(), 0);
    auto a = torch::full({1}, static_cast<double>(rank + 1));
    Work w = pg.all_reduce_async(a, ReduceOp::kProduct);
    w.wait();
    EXPECT_TRUE(w.completed());
    EXPECT_EQ(a.item<double>(), 6.0);
  });
}

TEST(Collectives, BroadcastAllGatherBarrier) {
  run_ranks(2, [](int rank, ProcessGroup& pg) {
    auto t = torch::arange(5, torch::kFloat) * (rank + 1);
    pg.broadcast(t, 1);
    EXPECT_TRUE(torch::equal(t, torch::arange(5, torch::kFloat) * 2));
    auto parts = pg.all_gather(torch::full({2, 2}, rank));
    ASSERT_EQ(parts.size(), 2u);
    EXPECT_TRUE(torch::equal(parts[0], torch::full({2, 2}, 0)));
    EXPECT_TRUE(torch::equal(parts[1], torch::full({2, 2}, 1)));
    pg.barrier();
    EXPECT_THROW(pg.broadcast(t, 2), std::exception);
  });
}

TEST(Collectives, BytesOfDifferentLengths) {
  run_ranks(3, [](int rank, ProcessGroup& pg) {
    std::string mine = rank == 1 ? std::string() : std::string(rank * 1000 + 3, 'a' + rank);
    mine += rank == 2 ? std::string("\0bin", 4) : std::string();
    auto all = pg.all_gather_bytes(mine);
    ASSERT_EQ(all.size(), 3u);
    EXPECT_EQ(all[0], std::string(3, 'a'));
    EXPECT_EQ(all[1], "");
    EXPECT_EQ(all[2], std::string(2003, 'c') + std::string("\0bin", 4));
    std::string got = pg.broadcast_bytes(rank == 2 ? "from two" : "ignored", 2);
    EXPECT_EQ(got, "from two");
  });
}

TEST(Collectives, ReduceToOneRank) {
  run_ranks(3, [](int rank, ProcessGroup& pg) {
    const std::pair<ReduceOp, float> cases[] = {{ReduceOp::kSum, 6.0f},
                                                {ReduceOp::kAvg, 2.0f},
                                                {ReduceOp::kMin, 1.0f},
                                                {ReduceOp::kMax, 3.0f},
                                                {ReduceOp::kProduct, 6.0f}};
    for (const auto& [op, expected] : cases) {
      auto t = torch::full({3}, static_cast<float>(rank + 1));
      pg.reduce(t, 1, op);
      if (rank == 1) {
        EXPECT_TRUE(torch::equal(t, torch::full({3}, expected)));
      }
    }
    auto i = torch::full({1}, static_cast<int64_t>(rank + 1));  // 6 / 3 rounds down
    pg.reduce(i, 0, ReduceOp::kAvg);
    if (rank == 0) {
      EXPECT_EQ(i.item<int64_t>(), 2);
    }
    EXPECT_THROW(pg.reduce(i, 3), Error);
  });
}

TEST(Collectives, BarrierWithTimeout) {
  auto errors = errors_of_ranks(3, [](int rank, ProcessGroup& pg) {
    for (int i = 0; i < 5; ++i) pg.barrier(std::chrono::seconds(30));
    if (rank != 2) pg.barrier(std::chrono::milliseconds(300));  // rank 2 never arrives
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("barrier timed out after 300 ms"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("not arrived: 2"), std::string::npos) << errors[r];
  }
  EXPECT_EQ(errors[2], "");
}

TEST(Collectives, StoreIsSharedAcrossRanks) {
  run_ranks(2, [](int rank, ProcessGroup& pg) {
    auto store = pg.store();
    store->set("k" + std::to_string(rank), std::vector<uint8_t>{static_cast<uint8_t>(rank)});
    auto other = store->get("k" + std::to_string(1 - rank));
    EXPECT_EQ(other, std::vector<uint8_t>{static_cast<uint8_t>(1 - rank)});
  });
}

TEST(Collectives, BackendNames) {
  EXPECT_EQ(parse_backend("gloo"), Backend::kGloo);
  EXPECT_EQ(parse_backend("nccl"), Backend::kNccl);
  EXPECT_EQ(parse_backend("auto"), Backend::kAuto);
  EXPECT_THROW(parse_backend("mpi"), Error);
}

}  // namespace
}  // namespace ddprun
