#include "ddprun/object_collectives.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "test_ranks.hpp"

namespace ddprun {
namespace {

using testing::errors_of_ranks;
using testing::run_ranks;

TEST(ObjectCollectives, AllGatherStringsOfDifferentLengths) {
  run_ranks(3, [](int rank, ProcessGroup& pg) {
    std::vector<std::string> out{"stale"};
    all_gather_object(pg, out, rank == 1 ? std::string() : std::string(rank * 500 + 1, 'x'));
    ASSERT_EQ(out.size(), 3u);
    EXPECT_EQ(out[0], "x");
    EXPECT_EQ(out[1], "");
    EXPECT_EQ(out[2], std::string(1001, 'x'));
  });
}

TEST(ObjectCollectives, TensorsOfDifferentShapes) {
  run_ranks(2, [](int rank, ProcessGroup& pg) {
    std::vector<at::Tensor> out;
    all_gather_object(pg, out, torch::arange(rank * 3 + 2, torch::kDouble).reshape({-1, 1}));
    ASSERT_EQ(out.size(), 2u);
    EXPECT_TRUE(torch::equal(out[0], torch::arange(2, torch::kDouble).reshape({-1, 1})));
    EXPECT_TRUE(torch::equal(out[1], torch::arange(5, torch::kDouble).reshape({-1, 1})));

    std::vector<std::vector<at::Tensor>> lists;
    gather_object(pg, std::vector<at::Tensor>(rank + 1, torch::ones({rank + 1})),
                  rank == 1 ? &lists : nullptr, 1);
    if (rank == 1) {
      ASSERT_EQ(lists.size(), 2u);
      EXPECT_EQ(lists[0].size(), 1u);
      ASSERT_EQ(lists[1].size(), 2u);
      EXPECT_TRUE(torch::equal(lists[1][1], torch::ones({2})));
    } else {
      EXPECT_TRUE(lists.empty());
    }
  });
}

TEST(ObjectCollectives, BroadcastReplacesTheListOnOtherRanks) {
  run_ranks(3, [](int rank, ProcessGroup& pg) {
    std::vector<std::string> list;
    if (rank == 2) list = {"a", "", std::string(100000, 'z')};
    if (rank == 0) list = {"will", "be", "replaced", "entirely"};
    broadcast_object_list(pg, list, 2);
    ASSERT_EQ(list.size(), 3u);
    EXPECT_EQ(list[1], "");
    EXPECT_EQ(list[2], std::string(100000, 'z'));
    std::vector<std::string> empty{"x"};
    if (rank == 0) empty.clear();
    broadcast_object_list(pg, empty, 0);
    EXPECT_TRUE(empty.empty());
  });
}

TEST(ObjectCollectives, GatherNeedsAnOutputOnDst) {
  auto errors = errors_of_ranks(1, [](int, ProcessGroup& pg) {
    gather_object<std::string>(pg, "x", nullptr, 0);
  });
  EXPECT_NE(errors[0].find("needs an output list"), std::string::npos) << errors[0];
}

TEST(ObjectCollectives, MalformedBytesAreErrors) {
  EXPECT_EQ(detail::unpack(detail::pack({"a", "", "bc"})),
            (std::vector<std::string>{"a", "", "bc"}));
  std::string packed = detail::pack({"abc", "de"});
  EXPECT_THROW(detail::unpack(packed.substr(0, packed.size() - 1)), Error);
  EXPECT_THROW(detail::unpack(std::string(8, '\xff')), Error);  // a huge count, no entries
  EXPECT_THROW(ObjectCodec<at::Tensor>::decode("not a tensor"), Error);
}

}  // namespace
}  // namespace ddprun
