// ProcessGroup's collectives (ddprun/process_group.hpp): tensors, then bytes.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "ddprun/heartbeat.hpp"
#include "process_group_impl.hpp"

namespace ddprun {

Work ProcessGroup::all_reduce_async(at::Tensor& tensor, ReduceOp op) {
  const bool native_avg = impl_->backend == Backend::kNccl;
  c10d::AllreduceOptions opts;
  opts.reduceOp =
      (op == ReduceOp::kAvg && native_avg) ? c10d::ReduceOp(c10d::ReduceOp::AVG) : to_c10d(op);
  std::vector<at::Tensor> tensors{tensor};
  auto w = impl_->pg->allreduce(tensors, opts);
  if (op == ReduceOp::kAvg && !native_avg) {
    const int n = size();
    at::Tensor t = tensor;
    return impl_->submit(std::move(w), [t, n]() mutable {
      if (t.is_floating_point() || t.is_complex()) {
        t.div_(n);
      } else {
        t.div_(n, "floor");
      }
    });
  }
  return impl_->submit(std::move(w));
}

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  all_reduce_async(tensor, op).wait();
}

Work ProcessGroup::broadcast_async(at::Tensor& tensor, int root) {
  if (root < 0 || root >= size()) {
    throw Error("broadcast: root " + std::to_string(root) + " is not a rank of this group");
  }
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.rootTensor = 0;
  std::vector<at::Tensor> tensors{tensor};
  return impl_->submit(impl_->pg->broadcast(tensors, opts));
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  broadcast_async(tensor, root).wait();
}

std::vector<at::Tensor> ProcessGroup::all_gather(const at::Tensor& tensor) {
  at::Tensor input = tensor.contiguous();
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < size(); ++i) outputs[0].push_back(at::empty_like(input));
  std::vector<at::Tensor> inputs{input};
  impl_->await(impl_->pg->allgather(outputs, inputs));
  heartbeat();
  return outputs[0];
}

void ProcessGroup::reduce(at::Tensor& tensor, int dst, ReduceOp op) {
  if (dst < 0 || dst >= size()) {
    throw Error("reduce: dst " + std::to_string(dst) + " is not a rank of this group");
  }
  c10d::ReduceOptions opts;
  opts.reduceOp = to_c10d(op);  // kAvg: a sum, divided on dst below
  opts.rootRank = dst;
  opts.rootTensor = 0;
  std::vector<at::Tensor> tensors{tensor};
  impl_->await(impl_->pg->reduce(tensors, opts));
  heartbeat();
  if (op == ReduceOp::kAvg && rank() == dst) {
    if (tensor.is_floating_point() || tensor.is_complex()) {
      tensor.div_(size());
    } else {
      tensor.div_(size(), "floor");
    }
  }
}

void ProcessGroup::barrier(std::chrono::milliseconds timeout) {
  auto& store = *impl_->barrier_store;
  const std::string round = std::to_string(impl_->barrier_round++);
  // Reaching round r means every rank finished waiting in round r - 2: its keys are garbage.
  if (rank() == 0 && impl_->barrier_round > 2) {
    const std::string old = std::to_string(impl_->barrier_round - 3);
    store.deleteKey(old + "/done");
    store.deleteKey(old + "/count");
    for (int r = 0; r < size(); ++r) store.deleteKey(old + "/" + std::to_string(r));
  }
  store.set(round + "/" + std::to_string(rank()), std::vector<uint8_t>{1});
  if (store.add(round + "/count", 1) == size()) {
    store.set(round + "/done", std::vector<uint8_t>{1});
  } else {
    try {
      store.wait({round + "/done"}, timeout);
    } catch (const std::exception& e) {
      std::string missing;
      for (int r = 0; r < size(); ++r) {
        bool arrived = true;
        try {
          arrived = store.check({round + "/" + std::to_string(r)});
        } catch (const std::exception&) {
        }
        if (!arrived) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw Error("barrier timed out after " + std::to_string(timeout.count()) + " ms on rank " +
                  std::to_string(rank()) +
                  "; rank(s) not arrived: " + (missing.empty() ? "unknown" : missing));
    }
  }
  heartbeat();
}

void ProcessGroup::barrier() {
  if (impl_->backend == Backend::kNccl) {
    // ProcessGroupNCCL's barrier guesses a device; a one-element all-reduce on ours is exact.
    at::Tensor t = at::zeros({1}, at::TensorOptions().device(impl_->device));
    all_reduce(t);
    t.cpu();
    return;
  }
  impl_->await(impl_->pg->barrier());
  heartbeat();
}

std::vector<std::string> ProcessGroup::all_gather_bytes(std::string_view bytes) {
  const auto on_device = at::TensorOptions().device(impl_->device);
  at::Tensor len = at::full({1}, static_cast<int64_t>(bytes.size()), on_device.dtype(at::kLong));
  std::vector<at::Tensor> lens = all_gather(len);
  std::vector<int64_t> sizes;
  int64_t max_len = 0;
  for (const auto& l : lens) {
    sizes.push_back(l.cpu().item<int64_t>());
    max_len = std::max(max_len, sizes.back());
  }
  at::Tensor buf = at::zeros({std::max<int64_t>(max_len, 1)}, at::kByte);
  std::memcpy(buf.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  std::vector<at::Tensor> parts = all_gather(buf.to(impl_->device));
  std::vector<std::string> out;
  for (size_t r = 0; r < parts.size(); ++r) {
    at::Tensor cpu = parts[r].cpu();
    out.emplace_back(reinterpret_cast<const char*>(cpu.data_ptr<uint8_t>()),
                     static_cast<size_t>(sizes[r]));
  }
  return out;
}

std::string ProcessGroup::broadcast_bytes(std::string_view bytes, int root) {
  const auto on_device = at::TensorOptions().device(impl_->device);
  const bool is_root = rank() == root;
  at::Tensor len = at::full({1}, is_root ? static_cast<int64_t>(bytes.size()) : int64_t{0},
                            on_device.dtype(at::kLong));
  broadcast(len, root);
  const int64_t n = len.cpu().item<int64_t>();
  at::Tensor buf = at::zeros({std::max<int64_t>(n, 1)}, at::kByte);
  if (is_root) std::memcpy(buf.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  at::Tensor dev = buf.to(impl_->device);
  broadcast(dev, root);
  at::Tensor cpu = dev.cpu();
  return std::string(reinterpret_cast<const char*>(cpu.data_ptr<uint8_t>()),
                     static_cast<size_t>(n));
}

std::vector<std::string> ProcessGroup::gather_bytes(std::string_view bytes, int dst) {
  if (dst < 0 || dst >= size()) {
    throw Error("gather_bytes: dst " + std::to_string(dst) + " is not a rank of this group");
  }
  // As Python's gather_object: every rank learns the longest length, then a padded gather.
  const auto on_device = at::TensorOptions().device(impl_->device);
  at::Tensor len = at::full({1}, static_cast<int64_t>(bytes.size()), on_device.dtype(at::kLong));
  std::vector<int64_t> sizes;
  int64_t max_len = 1;
  for (const auto& l : all_gather(len)) {
    sizes.push_back(l.cpu().item<int64_t>());
    max_len = std::max(max_len, sizes.back());
  }
  at::Tensor buf = at::zeros({max_len}, at::kByte);
  std::memcpy(buf.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  std::vector<at::Tensor> inputs{buf.to(impl_->device)};
  std::vector<std::vector<at::Tensor>> outputs;
  if (rank() == dst) {
    outputs.emplace_back();
    for (int r = 0; r < size(); ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  }
  c10d::GatherOptions opts;
  opts.rootRank = dst;
  impl_->await(impl_->pg->gather(outputs, inputs, opts));
  heartbeat();
  std::vector<std::string> out;
  if (rank() != dst) return out;
  for (size_t r = 0; r < outputs[0].size(); ++r) {
    at::Tensor cpu = outputs[0][r].cpu();
    out.emplace_back(reinterpret_cast<const char*>(cpu.data_ptr<uint8_t>()),
                     static_cast<size_t>(sizes[r]));
  }
  return out;
}

}  // namespace ddprun
