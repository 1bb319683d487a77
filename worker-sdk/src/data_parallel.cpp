#include "ddprun/data_parallel.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <map>
#include <sstream>
#include <tuple>

#include "group_recovery.hpp"
#include "reducer.hpp"

namespace ddprun {
namespace {

// Python's DDP broadcasts module state in flat buffers of up to 250 MiB.
constexpr int64_t kBroadcastChunkBytes = 250LL * 1024 * 1024;

std::string describe_param(const std::string& name, const at::Tensor& p) {
  std::ostringstream s;
  s << name << " " << p.scalar_type() << " shape " << p.sizes() << " strides " << p.strides()
    << (p.requires_grad() ? "" : " (frozen)");
  return s.str();
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// All ranks must hold the same parameters in the same order, or buckets would mix tensors.
// Every rank compares every rank's list with rank 0's, so all of them throw the same error.
void verify_same_parameters(ProcessGroup& group,
                            const std::vector<std::pair<std::string, at::Tensor>>& params) {
  std::string mine;
  for (const auto& [name, p] : params) mine += describe_param(name, p) + "\n";
  std::vector<std::string> all = group.all_gather_bytes(mine);
  const std::vector<std::string> ref = split_lines(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    const std::vector<std::string> other = split_lines(all[r]);
    const size_t n = std::min(ref.size(), other.size());
    for (size_t i = 0; i < n; ++i) {
      if (ref[i] != other[i]) {
        throw Error("DistributedDataParallel: rank " + std::to_string(r) + " parameter " +
                    std::to_string(i) + " is [" + other[i] + "] but rank 0 has [" + ref[i] +
                    "]; every rank must construct the same model");
      }
    }
    if (ref.size() != other.size()) {
      throw Error("DistributedDataParallel: rank " + std::to_string(r) + " has " +
                  std::to_string(other.size()) + " parameters but rank 0 has " +
                  std::to_string(ref.size()) + " (first extra: [" +
                  (other.size() > n ? other[n] : ref[n]) +
                  "]); every rank must construct the "
                  "same model");
    }
  }
}

// Broadcasts `tensors` from `root` in flat per-(dtype, device) chunks and copies the result
// back into them.
void broadcast_coalesced(ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                         int root = 0) {
  if (group.size() == 1 || tensors.empty()) return;
  at::NoGradGuard no_grad;
  std::map<std::tuple<int, int, int>, std::vector<at::Tensor>> by_kind;
  for (const at::Tensor& t : tensors) {
    by_kind[{static_cast<int>(t.scalar_type()), static_cast<int>(t.device().type()),
             static_cast<int>(t.device().index())}]
        .push_back(t);
  }
  for (auto& [kind, list] : by_kind) {
    size_t begin = 0;
    while (begin < list.size()) {
      size_t end = begin;
      int64_t bytes = 0;
      std::vector<at::Tensor> flat_parts;
      while (end < list.size() && (end == begin || bytes < kBroadcastChunkBytes)) {
        bytes += list[end].numel() * static_cast<int64_t>(list[end].element_size());
        flat_parts.push_back(list[end].detach().reshape({-1}));
        ++end;
      }
      at::Tensor flat = at::cat(flat_parts);
      group.broadcast(flat, root);
      int64_t offset = 0;
      for (size_t i = begin; i < end; ++i) {
        at::Tensor t = list[i].detach();
        t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
      begin = end;
    }
  }
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module,
                           std::shared_ptr<ProcessGroup> group, DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  if (!module_) throw Error("DistributedDataParallel: module is null");
  if (!group_) throw Error("DistributedDataParallel: process group is null");
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    named.emplace_back(item.key(), item.value());
  }
  std::vector<at::Tensor> trainable;
  std::vector<std::string> names;
  for (const auto& [name, p] : named) {
    if (!p.requires_grad()) continue;
    trainable.push_back(p);
    names.push_back(name);
  }
  if (trainable.empty()) {
    throw Error("DistributedDataParallel: the module has no parameter that requires a gradient");
  }
  // A replacement in an in-process recovery is wrapped while the survivors train: they do not
  // take part in these collectives; its TrainingLoop receives their state instead.
  if (!detail::GroupRecovery::awaiting_state(*group_)) {
    verify_same_parameters(*group_, named);
    std::vector<at::Tensor> state;
    for (const auto& [name, p] : named) state.push_back(p);
    for (const auto& b : module_->buffers(/*recurse=*/true)) state.push_back(b);
    broadcast_coalesced(*group_, state);
  }

  reducer_ = std::make_unique<Reducer>(std::move(trainable), std::move(names), *group_, options_);
}

DataParallel::~DataParallel() = default;

void DataParallel::prepare_forward() {
  reducer_->set_sync(sync_);
  reducer_->reattach_replaced_parameters();
  const bool grad = c10::GradMode::is_enabled();
  if (join_ != nullptr && join_notifies_) {
    const int training = join_->notify(grad, grad && sync_);
    if (!join_->options().divide_by_initial_world_size) reducer_->set_divisor(training);
  }
  // Every rank reaches this forward together, as PyTorch's rebuild (a collective) assumes.
  if (grad) reducer_->rebuild_buckets_if_due();
  if (options_.broadcast_buffers && grad) sync_buffers(/*training=*/true);
}

void DataParallel::sync_buffers(bool training) {
  std::vector<at::Tensor> buffers = module_->buffers(/*recurse=*/true);
  if (buffers.empty() || group_->size() == 1) return;
  // Under a Join, rank 0 may have stopped training: its buffers are stale.
  const int root = join_ != nullptr ? highest_rank_where(training) : 0;
  broadcast_coalesced(*group_, buffers, root);
}

int DataParallel::highest_rank_where(bool candidate) {
  at::Tensor r = at::full({1}, candidate ? group_->rank() : -1,
                          at::TensorOptions().dtype(at::kInt).device(group_->device()));
  group_->all_reduce(r, ReduceOp::kMax);
  const int rank = r.cpu().item<int>();
  if (rank < 0) throw Error("Join: no rank qualified as the source of the model (internal error)");
  return rank;
}

void DataParallel::join_shadow(const JoinRound& round) {
  // The same collectives, in the same order, as prepare_forward() and a synchronised backward of
  // the ranks still training.
  if (round.grad_enabled) {
    reducer_->rebuild_buckets_if_due();
    if (options_.broadcast_buffers) sync_buffers(/*training=*/false);
  }
  if (round.sync) reducer_->shadow_backward();
}

void DataParallel::join_finish(bool is_last_joiner) {
  // The last rank to finish trained on every iteration: its model is everyone's.
  const int root = highest_rank_where(is_last_joiner);
  std::vector<at::Tensor> state = module_->parameters(/*recurse=*/true);
  for (const at::Tensor& b : module_->buffers(/*recurse=*/true)) state.push_back(b);
  broadcast_coalesced(*group_, state, root);
  reducer_->set_divisor(group_->size());
}

void DataParallel::abandon_backward() {
  reducer_->abandon_backward();
}

void DataParallel::rejoin_group() {
  reducer_->rejoin_transport();
}

std::vector<BucketInfo> DataParallel::buckets() const {
  return reducer_->layout();
}

std::vector<size_t> DataParallel::grad_ready_order() const {
  return reducer_->local_ready_order();
}

bool DataParallel::buckets_rebuilt() const {
  return reducer_->rebuilt();
}

void DataParallel::register_comm_hook(CommHook hook) {
  reducer_->set_comm_hook(std::move(hook));
}

std::string DataParallel::transport() const {
  if (reducer_->has_comm_hook()) return "comm hook";
  return reducer_->uses_shared_memory() ? "shared memory" : group_->backend_name();
}

}  // namespace ddprun
