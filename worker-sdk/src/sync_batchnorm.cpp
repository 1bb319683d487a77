#include "ddprun/sync_batchnorm.hpp"

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn/modules/batchnorm.h>

#include <algorithm>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "batch_norm_parts.hpp"

namespace ddprun {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The dimensions statistics are taken over: all but the channel dimension 1.
std::vector<int64_t> reduced_dims(int64_t dim) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < dim; ++d) dims.push_back(d);
  return dims;
}

// Shape that broadcasts a per-channel vector against an (N, C, *) input.
std::vector<int64_t> channel_shape(int64_t dim, int64_t channels) {
  std::vector<int64_t> shape(static_cast<size_t>(dim), 1);
  shape[1] = channels;
  return shape;
}

// Half and bfloat16 inputs keep their statistics in float, as BatchNorm's kernels do.
at::ScalarType stats_type(const at::Tensor& input) {
  const auto t = input.scalar_type();
  return t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t;
}

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

struct GlobalStats {
  at::Tensor mean;   // per channel, in double
  at::Tensor var;    // biased, per channel, in double
  double count = 0;  // values per channel over all ranks
};

// Every rank contributes (mean, biased variance, count) per channel in one all_gather, then
// every rank combines the same rows in rank order (means and variances combined, not sums of
// squares, which cancel), so all ranks get bitwise the same statistics. Counts
// may differ between ranks, hence a gather rather than a sum. The rows travel in double: a float
// count is exact only up to 2^24 values per channel, which a segmentation batch reaches.
GlobalStats global_stats(const at::Tensor& input, ProcessGroup& group) {
  torch::NoGradGuard no_grad;
  const at::Tensor x = input.detach();
  const int64_t channels = x.size(1);
  const int64_t local_count = x.numel() / channels;
  at::Tensor mine = at::zeros({2 * channels + 1}, x.options().dtype(at::kDouble));
  if (local_count > 0) {
    const auto dims = reduced_dims(x.dim());
    auto [var, mean] = at::var_mean(x, at::IntArrayRef(dims), /*unbiased=*/false,
                                    /*keepdim=*/false);
    mine.narrow(0, 0, channels).copy_(mean);
    mine.narrow(0, channels, channels).copy_(var);
    mine[2 * channels].fill_(static_cast<double>(local_count));
  }
  const at::Tensor all = at::stack(group.all_gather(mine));  // (world, 2C + 1), rank order
  const at::Tensor counts = all.narrow(1, 2 * channels, 1);
  GlobalStats out;
  out.count = counts.sum().item<double>();
  if (out.count == 1) {
    throw Error(
        "SyncBatchNorm: expected more than 1 value per channel when training, got 1 "
        "over all ranks (input " +
        shape_of(x) + " on this rank)");
  }
  out.mean = at::zeros({channels}, mine.options());
  out.var = at::zeros({channels}, mine.options());
  if (out.count > 0) {  // else every rank is empty: nothing to normalise
    const at::Tensor weights = counts / out.count;
    const at::Tensor means = all.narrow(1, 0, channels);
    out.mean = (means * weights).sum(0);
    out.var = ((all.narrow(1, channels, channels) + (means - out.mean).square()) * weights).sum(0);
  }
  return out;
}

// momentum * batch + (1 - momentum) * running, with the global unbiased variance, as PyTorch's
// SyncBatchNorm does; left alone for an empty global batch, as BatchNorm's kernel leaves it.
void update_running_stats(const GlobalStats& stats, at::Tensor& running_mean,
                          at::Tensor& running_var, double momentum) {
  if (!running_mean.defined() || stats.count == 0) return;
  torch::NoGradGuard no_grad;
  const at::Tensor unbiased = stats.var * (stats.count / (stats.count - 1));
  running_mean.copy_(stats.mean * momentum + running_mean.to(at::kDouble) * (1 - momentum));
  running_var.copy_(unbiased * momentum + running_var.to(at::kDouble) * (1 - momentum));
}

// Normalisation over the global batch as an autograd function. forward is elementwise, with the
// gathered statistics; backward all-reduces the two per-channel sums the input gradient needs
// (sum of dy, sum of dy * (x - mean)) and leaves the weight/bias gradients local, as PyTorch's.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& mean,
                            const at::Tensor& invstd, double count,
                            const std::shared_ptr<ProcessGroup>& group) {
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(group));
    ctx->saved_data["bias_type"] = static_cast<int64_t>(bias.scalar_type());
    // input * alpha + beta, the form BatchNorm's CPU kernel uses.
    const auto shape = channel_shape(input.dim(), input.size(1));
    const at::Tensor alpha = invstd * weight;
    const at::Tensor beta = bias - mean * alpha;
    return (input * alpha.view(shape) + beta.view(shape)).to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const double count = ctx->saved_data["count"].toDouble();
    const at::Tensor& dy = grad_outputs[0];
    const int64_t channels = input.size(1);
    const auto shape = channel_shape(input.dim(), channels);
    const auto dims = reduced_dims(input.dim());

    const at::Tensor xmu = input - mean.view(shape);
    const at::Tensor sum_dy = dy.sum(at::IntArrayRef(dims), false, mean.scalar_type());
    const at::Tensor sum_dy_xmu = (dy * xmu).sum(at::IntArrayRef(dims), false, mean.scalar_type());
    variable_list grads(7);
    if (ctx->needs_input_grad(1)) grads[1] = (sum_dy_xmu * invstd).to(weight.scalar_type());
    if (ctx->needs_input_grad(2)) {
      grads[2] = sum_dy.to(static_cast<at::ScalarType>(ctx->saved_data["bias_type"].toInt()));
    }
    if (ctx->needs_input_grad(0)) {
      at::Tensor sums = at::cat({sum_dy, sum_dy_xmu});
      auto group =
          c10::static_intrusive_pointer_cast<GroupCapsule>(ctx->saved_data["group"].toCapsule());
      group->group->all_reduce(sums);
      // An empty global batch has nothing to differentiate; keep 0/0 out of the empty result.
      const double n = std::max(count, 1.0);
      const at::Tensor mean_dy = sums.narrow(0, 0, channels) / n;
      const at::Tensor mean_dy_xmu = sums.narrow(0, channels, channels) / n;
      const at::Tensor scale = invstd * weight;
      grads[0] = ((dy - mean_dy.view(shape) - xmu * (invstd.square() * mean_dy_xmu).view(shape)) *
                  scale.view(shape))
                     .to(input.scalar_type());
    }
    return grads;
  }

 private:
  // The group rides in the context's IValue map, which holds custom objects only as capsules.
  struct GroupCapsule : torch::CustomClassHolder {
    explicit GroupCapsule(std::shared_ptr<ProcessGroup> g) : group(std::move(g)) {}
    std::shared_ptr<ProcessGroup> group;
  };
};

BatchNormParts batch_norm_parts_or_throw(const torch::nn::Module& m) {
  auto parts = batch_norm_parts(m);
  if (!parts) {
    throw Error("SyncBatchNorm: cannot take over " + m.name() +
                ", which is not a torch::nn::BatchNorm1d, BatchNorm2d or BatchNorm3d");
  }
  return *parts;
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options,
                                     std::shared_ptr<ProcessGroup> group)
    : options(options), group_(checked_group(std::move(group))) {
  reset();
}

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::Module& batch_norm,
                                     std::shared_ptr<ProcessGroup> group)
    : options(batch_norm_parts_or_throw(batch_norm).options),
      group_(checked_group(std::move(group))) {
  const BatchNormParts p = batch_norm_parts_or_throw(batch_norm);
  // The same tensors, registered as they are (requires_grad included).
  weight = register_parameter("weight", p.weight, p.weight.defined() && p.weight.requires_grad());
  bias = register_parameter("bias", p.bias, p.bias.defined() && p.bias.requires_grad());
  running_mean = register_buffer("running_mean", p.running_mean);
  running_var = register_buffer("running_var", p.running_var);
  num_batches_tracked = register_buffer("num_batches_tracked", p.num_batches_tracked);
  train(p.training);
}

// As torch::nn::BatchNorm's reset(), so that clone() and fresh layers match it.
void SyncBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::empty({c}));
    bias = register_parameter("bias", torch::empty({c}));
  } else {
    weight = register_parameter("weight", at::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({c}));
    running_var = register_buffer("running_var", torch::ones({c}));
    num_batches_tracked =
        register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
  } else {
    running_mean = register_buffer("running_mean", at::Tensor());
    running_var = register_buffer("running_var", at::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", at::Tensor());
  }
  reset_parameters();
}

void SyncBatchNormImpl::reset_running_stats() {
  if (options.track_running_stats()) {
    running_mean.zero_();
    running_var.fill_(1);
    num_batches_tracked.zero_();
  }
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (options.affine()) {
    torch::NoGradGuard no_grad;
    weight.fill_(1);
    bias.zero_();
  }
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "ddprun::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << std::boolalpha << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  if (input.dim() < 2) {
    throw Error(
        "SyncBatchNorm: expected input of shape (N, C, ...) with 2 or more dimensions, "
        "got " +
        shape_of(input));
  }
  if (input.size(1) == 0) {
    throw Error("SyncBatchNorm: input " + shape_of(input) + " has no channels (dim 1)");
  }
  if (input.size(1) != options.num_features()) {
    throw Error("SyncBatchNorm: expected " + std::to_string(options.num_features()) +
                " channels (dim 1) in input, got " + shape_of(input));
  }
  // The momentum and the cumulative average when momentum is unset, as BatchNorm's forward.
  double factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
    num_batches_tracked += 1;  // in place: the tensor may be a converted BatchNorm's too
    if (!options.momentum().has_value()) factor = 1.0 / num_batches_tracked.item<double>();
  }
  if (!is_training() || group_->size() == 1) {
    const bool batch_stats = is_training() || !options.track_running_stats();
    if (batch_stats && input.numel() / input.size(1) == 1) {
      throw Error(
          "SyncBatchNorm: expected more than 1 value per channel when training, got "
          "input " +
          shape_of(input));
    }
    return torch::batch_norm(input, weight, bias, running_mean, running_var, batch_stats, factor,
                             options.eps(), at::globalContext().userEnabledCuDNN());
  }
  const GlobalStats stats = global_stats(input, *group_);
  update_running_stats(stats, running_mean, running_var, factor);
  const auto type = stats_type(input);
  // Without affine parameters, constants stand in: LibTorch 1.13's autograd functions reject
  // undefined tensor arguments.
  const int64_t c = options.num_features();
  const at::Tensor w = weight.defined() ? weight : at::ones({c}, input.options().dtype(type));
  const at::Tensor b = bias.defined() ? bias : at::zeros({c}, input.options().dtype(type));
  return SyncBatchNormFunction::apply(input, w, b, stats.mean.to(type),
                                      (stats.var + options.eps()).rsqrt().to(type), stats.count,
                                      group_);
}

}  // namespace ddprun
