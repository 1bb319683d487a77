// Communication hooks: TensorFuture, the built-in hooks inside DDP, registration rules and user
// hooks (PowerSGD: powersgd_test.cpp).
#include "ddprun/comm_hooks.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <atomic>

#include "ddprun/data_parallel.hpp"
#include "hook_test_util.hpp"

namespace ddprun {
namespace {

using testing::borrow;
using testing::Grads;
using ::testing::HasSubstr;
using testing::make_net;
using testing::max_abs_diff;
using testing::Net;
using testing::run_ranks;
using testing::train;

// ---------------------------------------------------------------------------------------------
// TensorFuture

TEST(TensorFuture, ThenChainsRunOnceAtWait) {
  std::atomic<int> calls{0};
  auto f = TensorFuture::ready(torch::tensor({1.0, 2.0}));
  auto g = f.then([&](at::Tensor t) {
    ++calls;
    return t + 1;
  });
  auto h = g.then([&](at::Tensor t) {
    ++calls;
    return t * 2;
  });
  EXPECT_EQ(calls, 0);  // lazy: nothing runs before a wait
  EXPECT_TRUE(torch::equal(h.wait(), torch::tensor({4.0, 6.0})));
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(torch::equal(h.wait(), torch::tensor({4.0, 6.0})));
  EXPECT_TRUE(torch::equal(g.wait(), torch::tensor({2.0, 3.0})));  // computed already
  auto copy = h;                                                   // a handle: shares the result
  copy.wait();
  EXPECT_EQ(calls, 2);
}

TEST(TensorFuture, ErrorsPropagateAndAreKept) {
  std::atomic<int> calls{0};
  auto bad = TensorFuture::ready(torch::ones({1})).then([&](at::Tensor) -> at::Tensor {
    ++calls;
    throw Error("step failed");
  });
  std::atomic<int> later{0};
  auto after = bad.then([&](at::Tensor t) {
    ++later;
    return t;
  });
  for (int i = 0; i < 2; ++i) {
    try {
      after.wait();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("step failed"));
    }
  }
  EXPECT_THROW(bad.wait(), Error);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(later, 0);
}

TEST(TensorFuture, EmptyFutureIsAnError) {
  TensorFuture empty;
  EXPECT_FALSE(empty.valid());
  EXPECT_THROW(empty.wait(), Error);
  EXPECT_THROW(empty.then([](at::Tensor t) { return t; }), Error);
}

TEST(TensorFuture, AfterWaitsForTheCollective) {
  run_ranks(2, [](int rank, ProcessGroup& pg) {
    auto t = torch::full({3}, static_cast<float>(rank + 1));
    auto f =
        TensorFuture::after(pg.all_reduce_async(t), t).then([](at::Tensor s) { return s * 10; });
    EXPECT_TRUE(torch::equal(f.wait(), torch::full({3}, 30.0f)));
  });
}

// ---------------------------------------------------------------------------------------------
// Hooks inside DDP

TEST(CommHooks, AllreduceHookEqualsNoHook) {
  for (bool shm : {true, false}) {
    DdpOptions o;
    o.shared_memory = shm;
    // Two ranks: x/2 and x*0.5 are both exact, and a + b is one rounding either way, so the
    // built-in path and the hook give identical bits (also through several buckets).
    for (int64_t first_bucket : {int64_t{0}, int64_t{64}}) {
      auto plain = train(2, 4, o, nullptr, 6, 16, 3, first_bucket);
      auto hooked = train(
          2, 4, o,
          [](DataParallel& ddp, std::shared_ptr<ProcessGroup> pg) {
            ddp.register_comm_hook(hooks::allreduce(pg));
            EXPECT_EQ(ddp.transport(), "comm hook");
          },
          6, 16, 3, first_bucket);
      EXPECT_EQ(max_abs_diff(plain, hooked), 0.0) << "shm " << shm << " bucket " << first_bucket;
    }
  }
  // Three ranks: 1/3 is not exact, so within float rounding.
  auto plain3 = train(3, 3, DdpOptions{}, nullptr);
  auto hooked3 = train(3, 3, DdpOptions{}, [](DataParallel& ddp, std::shared_ptr<ProcessGroup> pg) {
    ddp.register_comm_hook(hooks::allreduce(pg));
  });
  EXPECT_LT(max_abs_diff(plain3, hooked3), 1e-6);
}

TEST(CommHooks, Fp16HookMatchesFp16Compression) {
  DdpOptions compressed;
  compressed.compression = GradCompression::kFp16;
  auto builtin = train(2, 4, compressed, nullptr);
  auto hooked = train(2, 4, DdpOptions{}, [](DataParallel& ddp, std::shared_ptr<ProcessGroup> pg) {
    ddp.register_comm_hook(hooks::fp16_compress(pg));
  });
  // The built-in path halves in float then casts; the hook casts then halves in fp16: the same
  // number unless the value is an fp16 subnormal (below 6.1e-5), where halving loses a bit.
  for (size_t s = 0; s < builtin.size(); ++s) {
    for (size_t i = 0; i < builtin[s].size(); ++i) {
      EXPECT_TRUE(torch::allclose(builtin[s][i], hooked[s][i], 0, 6e-8))
          << "step " << s << " param " << i << "\n"
          << builtin[s][i] << "\n"
          << hooked[s][i];
    }
  }
  // And it did compress: not the float all-reduce's numbers.
  auto plain = train(2, 4, DdpOptions{}, nullptr);
  EXPECT_GT(max_abs_diff(plain, hooked), 0.0);
}

TEST(CommHooks, Bf16Hook) {
#if TORCH_VERSION_MAJOR >= 2
  auto plain = train(2, 3, DdpOptions{}, nullptr);
  auto hooked = train(2, 3, DdpOptions{}, [](DataParallel& ddp, std::shared_ptr<ProcessGroup> pg) {
    ddp.register_comm_hook(hooks::bf16_compress(pg));
  });
  double diff = max_abs_diff(plain, hooked);
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(diff, 1e-2);  // bf16 keeps 8 bits of mantissa: |grad| < 1 here
#else
  run_ranks(1, [](int, ProcessGroup& pg) {
    try {
      hooks::bf16_compress(borrow(pg));
      ADD_FAILURE() << "bf16 over 1.13's Gloo accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("bfloat16"));
    }
  });
#endif
}

TEST(CommHooks, RegistrationRules) {
  Net net = make_net();
  run_ranks(1, [&](int, ProcessGroup& pg) {
    {
      DistributedDataParallel ddp(net, borrow(pg));
      EXPECT_THROW(ddp.register_comm_hook(CommHook()), Error);
      ddp.register_comm_hook(hooks::allreduce(borrow(pg)));
      try {
        ddp.register_comm_hook(hooks::allreduce(borrow(pg)));
        ADD_FAILURE() << "second hook accepted";
      } catch (const Error& e) {
        EXPECT_THAT(e.what(), HasSubstr("registered already"));
      }
    }
    {
      DistributedDataParallel ddp(net, borrow(pg));
      torch::mse_loss(ddp(torch::ones({2, 6})), torch::zeros({2, 3})).backward();
      try {
        ddp.register_comm_hook(hooks::allreduce(borrow(pg)));
        ADD_FAILURE() << "hook accepted after a backward";
      } catch (const Error& e) {
        EXPECT_THAT(e.what(), HasSubstr("before the first backward"));
      }
    }
    {
      DdpOptions o;
      o.compression = GradCompression::kFp16;
      DistributedDataParallel ddp(net, borrow(pg), o);
      try {
        ddp.register_comm_hook(hooks::allreduce(borrow(pg)));
        ADD_FAILURE() << "hook accepted with compression";
      } catch (const Error& e) {
        EXPECT_THAT(e.what(), HasSubstr("compression"));
      }
    }
    EXPECT_THROW(hooks::allreduce(nullptr), Error);
  });
}

TEST(CommHooks, CustomHookMayReturnAnotherTensor) {
  std::vector<size_t> seen;
  std::vector<bool> last;
  std::vector<Net> nets{make_net(), make_net()};
  Net ref = make_net(), ref2 = make_net();  // each rank's own gradient, without DDP
  torch::mse_loss(ref(torch::ones({2, 6})), torch::zeros({2, 3})).backward();
  torch::mse_loss(ref2(torch::ones({2, 6}) * 2), torch::zeros({2, 3})).backward();
  run_ranks(2, [&](int rank, ProcessGroup& pg) {
    Net local = nets[rank];
    DdpOptions o;
    o.first_bucket_cap_bytes = 8;  // one bucket per parameter
    o.bucket_cap_bytes = 8;
    DistributedDataParallel ddp(local, borrow(pg), o);
    // Reduces in double and returns a new tensor (a ready value after a chained step); rank 0
    // also records what it saw.
    ddp.register_comm_hook([&, rank, pg = borrow(pg)](GradBucket& bucket) {
      if (rank == 0) {
        seen.push_back(bucket.index());
        last.push_back(bucket.is_last());
        EXPECT_EQ(bucket.gradients().size(), bucket.parameters().size());
        int64_t n = 0;
        for (size_t i = 0; i < bucket.gradients().size(); ++i) {
          EXPECT_EQ(bucket.gradients()[i].sizes(), bucket.parameters()[i].sizes());
          n += bucket.gradients()[i].numel();
        }
        EXPECT_EQ(n, bucket.buffer().numel());
      }
      at::Tensor wide = bucket.buffer().to(at::kDouble);
      return TensorFuture::after(pg->all_reduce_async(wide), wide).then([](at::Tensor sum) {
        return sum * 10.0;  // a different tensor: 10 x the sum
      });
    });
    auto x = torch::ones({2, 6}) * (rank + 1);
    torch::mse_loss(ddp(x), torch::zeros({2, 3})).backward();
    // Reference: each rank's own gradient, summed, times 10.
    auto p = local->parameters(), a = ref->parameters(), b = ref2->parameters();
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_TRUE(torch::allclose(p[i].grad(), (a[i].grad() + b[i].grad()) * 10, 1e-5, 1e-6)) << i;
    }
  });
  ASSERT_EQ(seen.size(), 4u);  // four parameters over 64-byte buckets: one bucket each
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i], i);
    EXPECT_EQ(last[i], i + 1 == seen.size());
  }
}

TEST(CommHooks, AHookResultOfTheWrongSizeIsAnError) {
  Net net = make_net();
  run_ranks(1, [&](int, ProcessGroup& pg) {
    DistributedDataParallel ddp(net, borrow(pg));
    ddp.register_comm_hook([](GradBucket&) { return TensorFuture::ready(torch::zeros({3})); });
    try {
      torch::mse_loss(ddp(torch::ones({2, 6})), torch::zeros({2, 3})).backward();
      ADD_FAILURE() << "wrong-sized result accepted";
    } catch (const std::exception& e) {
      EXPECT_THAT(e.what(), HasSubstr("elements but its bucket"));
    }
  });
}

}  // namespace
}  // namespace ddprun
