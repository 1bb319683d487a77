// TensorFuture and the simple built-in communication hooks (PowerSGD: powersgd.cpp).
#include "ddprun/comm_hooks.hpp"

#include <ATen/ATen.h>

#include <mutex>

#include "compat.hpp"

namespace ddprun {

struct TensorFuture::State {
  std::mutex mu;
  std::function<at::Tensor()> compute;  // empty once run
  at::Tensor value;
  std::exception_ptr error;
};

TensorFuture TensorFuture::ready(at::Tensor value) {
  TensorFuture f;
  f.state_ = std::make_shared<State>();
  f.state_->value = std::move(value);
  return f;
}

TensorFuture TensorFuture::after(Work work, at::Tensor result) {
  TensorFuture f;
  f.state_ = std::make_shared<State>();
  f.state_->compute = [work, result]() mutable {
    work.wait();
    return result;
  };
  return f;
}

TensorFuture TensorFuture::then(std::function<at::Tensor(at::Tensor)> next) const {
  if (!state_) throw Error("TensorFuture::then on an empty future");
  TensorFuture f;
  f.state_ = std::make_shared<State>();
  f.state_->compute = [previous = *this, next = std::move(next)] { return next(previous.wait()); };
  return f;
}

at::Tensor TensorFuture::wait() const {
  if (!state_) throw Error("TensorFuture::wait on an empty future");
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->compute) {
    auto compute = std::move(state_->compute);
    state_->compute = nullptr;
    try {
      state_->value = compute();
    } catch (...) {
      state_->error = std::current_exception();
    }
  }
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->value;
}

namespace hooks {
namespace {

CommHook compress_hook(std::shared_ptr<ProcessGroup> group, at::ScalarType wire_type) {
  if (!group) throw Error("communication hook: process group is null");
  if (wire_type == at::kBFloat16 && group->backend() == Backend::kGloo &&
      !compat::kGlooReducesBFloat16) {
    throw Error(
        "bf16_compress hook: this LibTorch's Gloo cannot all-reduce bfloat16 (LibTorch 2.x "
        "can); use fp16_compress or NCCL");
  }
  return [group, wire_type](GradBucket& bucket) {
    at::Tensor& buffer = bucket.buffer();
    // Divided before the cast, as PyTorch does, so the sum stays within float16's range.
    at::Tensor wire = buffer.to(wire_type).div_(group->size());
    Work work = group->all_reduce_async(wire);
    return TensorFuture::after(work, wire).then([buffer](at::Tensor reduced) mutable {
      buffer.copy_(reduced);
      return buffer;
    });
  };
}

}  // namespace

CommHook allreduce(std::shared_ptr<ProcessGroup> group) {
  if (!group) throw Error("communication hook: process group is null");
  return [group](GradBucket& bucket) {
    at::Tensor& buffer = bucket.buffer();
    buffer.div_(group->size());
    return TensorFuture::after(group->all_reduce_async(buffer), buffer);
  };
}

CommHook fp16_compress(std::shared_ptr<ProcessGroup> group) {
  return compress_hook(std::move(group), at::kHalf);
}

CommHook bf16_compress(std::shared_ptr<ProcessGroup> group) {
  return compress_hook(std::move(group), at::kBFloat16);
}

}  // namespace hooks
}  // namespace ddprun
