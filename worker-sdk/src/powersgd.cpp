// The PowerSGD communication hook (comm_hooks.hpp): low-rank compression of each bucket's
// matrix-shaped gradients, with error feedback and warm start.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "ddprun/comm_hooks.hpp"

namespace ddprun {
namespace hooks {
namespace {

int64_t bytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

// Orthonormal columns for `m` (rows x r), in place. As PyTorch's PowerSGD: Gram-Schmidt for
// r <= 2 and half precision, a QR factorisation otherwise (faster for larger r, and stable when
// the columns are nearly dependent, e.g. a rank-r approximation of a lower-rank gradient).
// Gram-Schmidt normalises each column (by its norm plus `epsilon`), then removes it from the
// columns after it; an all-zero column stays zero.
void orthogonalize(at::Tensor m, double epsilon) {
  const int64_t cols = m.size(1);
  if (cols > 2 && (m.scalar_type() == at::kFloat || m.scalar_type() == at::kDouble)) {
    m.copy_(std::get<0>(at::linalg_qr(m)));
    return;
  }
  for (int64_t i = 0; i < cols; ++i) {
    at::Tensor col = m.narrow(1, i, 1);
    at::Tensor norm = col.norm(2, {0}, /*keepdim=*/true);
    if (epsilon != 0) norm.add_(epsilon);
    col.div_(norm.masked_fill(norm == 0, 1));
    if (i + 1 < cols) {
      at::Tensor rest = m.narrow(1, i + 1, cols - i - 1);
      rest.sub_((col * rest).sum(0, /*keepdim=*/true) * col);
    }
  }
}

// A seed for the k-th random draw of a state seeded with `seed` (splitmix64: well spread even
// for consecutive seeds and draws).
uint64_t derive_seed(uint64_t seed, uint64_t k) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (k + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// One matrix of a bucket that is compressed, and where its P and Q live in the packed tensors.
struct Compressed {
  at::Tensor matrix;  // n x m: what is compressed (the bucket, or its error-corrected copy)
  at::Tensor target;  // n x m view of the bucket: receives the approximation
  int64_t rank = 0;
  int64_t p_offset = 0, q_offset = 0;
};

// `g` (a view of `buffer`) as the same elements of `other`, which is laid out like `buffer`.
at::Tensor same_place(const at::Tensor& g, const at::Tensor& buffer, const at::Tensor& other) {
  return other.narrow(0, g.storage_offset() - buffer.storage_offset(), g.numel()).view(g.sizes());
}

at::Tensor slice_matrix(const at::Tensor& flat, int64_t offset, int64_t rows, int64_t cols) {
  return flat.narrow(0, offset, rows * cols).view({rows, cols});
}

}  // namespace

PowerSGDState::PowerSGDState(std::shared_ptr<ProcessGroup> group_, PowerSGDOptions options_)
    : group(std::move(group_)), options(options_) {
  const std::string what = "PowerSGD: ";
  if (!group) throw Error(what + "process group is null");
  if (options.matrix_approximation_rank < 1) {
    throw Error(what + "matrix_approximation_rank must be >= 1, got " +
                std::to_string(options.matrix_approximation_rank));
  }
  if (options.start_powerSGD_iter < 0) {
    throw Error(what + "start_powerSGD_iter must be >= 0, got " +
                std::to_string(options.start_powerSGD_iter));
  }
  if ((options.use_error_feedback || options.warm_start) && options.start_powerSGD_iter <= 1) {
    throw Error(what +
                "start_powerSGD_iter must be > 1 with use_error_feedback or warm_start "
                "(got " +
                std::to_string(options.start_powerSGD_iter) +
                "): DDP rebuilds its buckets after the first iteration, which would mismatch "
                "the per-bucket error and Q kept from before");
  }
  if (!(options.min_compression_rate >= 0)) {
    throw Error(what + "min_compression_rate must be >= 0, got " +
                std::to_string(options.min_compression_rate));
  }
  if (!(options.orthogonalization_epsilon >= 0)) {
    throw Error(what + "orthogonalization_epsilon must be >= 0, got " +
                std::to_string(options.orthogonalization_epsilon));
  }
}

namespace {

// One bucket's compression plan: which gradients become P Q^T, which go as they are.
struct Plan {
  std::vector<Compressed> matrices;
  std::vector<at::Tensor> uncompressed;  // from `source`
  std::vector<at::Tensor> targets;       // the same tensors in the bucket
  int64_t p_size = 0, q_size = 0;        // elements of all P's, all Q's
};

// With error feedback, compression starts from gradient + last error, formed in the error
// buffer itself, which becomes the new error (that minus the result) at the end: one buffer
// reused in place, and the bucket is only written with the result.
at::Tensor error_corrected(PowerSGDState& state, size_t index, const at::Tensor& input) {
  if (!state.options.use_error_feedback) return input;
  at::Tensor& error = state.error[index];
  if (error.defined() && error.numel() == input.numel()) {
    error.add_(input);
  } else {
    error = input.clone();
  }
  return error;
}

// Which tensors are worth compressing (a rank-r approximation smaller by min_compression_rate).
Plan plan_bucket(PowerSGDState& state, GradBucket& bucket, const at::Tensor& input,
                 const at::Tensor& source) {
  const PowerSGDOptions& o = state.options;
  Plan plan;
  for (const at::Tensor& grad : bucket.gradients()) {
    const at::Tensor g = same_place(grad, input, source);
    const int64_t n = g.dim() >= 1 ? g.size(0) : 0;
    const int64_t m = n > 0 ? g.numel() / n : 0;
    const int64_t r = std::min<int64_t>({n, m, static_cast<int64_t>(o.matrix_approximation_rank)});
    state.numel_before_compression += g.numel();
    if (g.dim() >= 1 &&
        static_cast<double>((n + m) * r) * o.min_compression_rate < static_cast<double>(n * m)) {
      plan.matrices.push_back(
          Compressed{g.view({n, m}), grad.view({n, m}), r, plan.p_size, plan.q_size});
      plan.p_size += n * r;
      plan.q_size += m * r;
      state.numel_after_compression += (n + m) * r;
    } else {
      plan.uncompressed.push_back(g);
      plan.targets.push_back(grad);
      state.numel_after_compression += g.numel();
    }
  }
  return plan;
}

// The bucket's P and Q memory (kept per bucket with warm start, Q's from the last step reused;
// else the same random Q's on every rank, drawn on the CPU from a seed all ranks derive alike),
// then P = M Q for every matrix.
std::pair<at::Tensor, at::Tensor> first_projection(PowerSGDState& state, size_t index,
                                                   const Plan& plan, const at::Tensor& input) {
  const PowerSGDOptions& o = state.options;
  at::Tensor& p_all = state.p[index];
  at::Tensor& q_all = state.q[index];
  const bool fresh = !o.warm_start || !p_all.defined() || p_all.numel() != plan.p_size ||
                     !q_all.defined() || q_all.numel() != plan.q_size;
  if (fresh) {
    p_all = at::empty({plan.p_size}, input.options());
    q_all = at::empty({plan.q_size}, input.options());
    at::Generator gen =
        at::detail::createCPUGenerator(derive_seed(o.random_seed, state.random_draws++));
    for (const Compressed& c : plan.matrices) {
      at::Tensor q = slice_matrix(q_all, c.q_offset, c.matrix.size(1), c.rank);
      q.copy_(at::randn(q.sizes(), gen, at::TensorOptions().dtype(input.scalar_type())));
    }
  }
  for (const Compressed& c : plan.matrices) {
    at::Tensor q = slice_matrix(q_all, c.q_offset, c.matrix.size(1), c.rank);
    orthogonalize(q, o.orthogonalization_epsilon);
    at::Tensor p = slice_matrix(p_all, c.p_offset, c.matrix.size(0), c.rank);
    at::mm_out(p, c.matrix, q);  // P = M Q
  }
  return {p_all, q_all};
}

// The uncompressed tensors, all-reduced packed, averaged back into the bucket.
at::Tensor unpack_averaged(const std::vector<at::Tensor>& targets, int world, at::Tensor reduced) {
  int64_t offset = 0;
  reduced.div_(world);
  for (const at::Tensor& t : targets) {
    at::Tensor dst = t;
    dst.copy_(reduced.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
  return reduced;
}

// When DDP waits for the bucket: orthogonalise the summed P's, Q = M^T P (one more
// all-reduce), M = P Q^T / world into the bucket.
void second_projection(PowerSGDState& state, const std::vector<Compressed>& matrices,
                       at::Tensor p_mem, at::Tensor q_mem, Work& p_work, int world) {
  if (matrices.empty()) return;
  const PowerSGDOptions& o = state.options;
  p_work.wait();
  for (const Compressed& c : matrices) {
    at::Tensor p = slice_matrix(p_mem, c.p_offset, c.matrix.size(0), c.rank);
    orthogonalize(p, o.orthogonalization_epsilon);
    at::Tensor q = slice_matrix(q_mem, c.q_offset, c.matrix.size(1), c.rank);
    at::mm_out(q, c.matrix.t(), p);  // Q = M^T P
  }
  state.bytes_reduced += bytes_of(q_mem);
  state.group->all_reduce_async(q_mem).wait();
  q_mem.div_(world);
  for (const Compressed& c : matrices) {
    at::Tensor p = slice_matrix(p_mem, c.p_offset, c.matrix.size(0), c.rank);
    at::Tensor q = slice_matrix(q_mem, c.q_offset, c.matrix.size(1), c.rank);
    at::Tensor m = c.target;
    at::mm_out(m, p, q.t());  // M ~ P Q^T
  }
}

// Starts an all-reduce of `t` when it has elements, counting its bytes.
Work all_reduce_counted(PowerSGDState& state, at::Tensor t) {
  if (t.numel() == 0) return Work();
  state.bytes_reduced += bytes_of(t);
  return state.group->all_reduce_async(t);
}

TensorFuture compress_bucket(const std::shared_ptr<PowerSGDState>& state, GradBucket& bucket) {
  const int world = state->group->size();
  at::Tensor input = bucket.buffer();
  const size_t index = bucket.index();
  at::Tensor source = error_corrected(*state, index, input);
  Plan plan = plan_bucket(*state, bucket, input, source);
  auto [p_all, q_all] = first_projection(*state, index, plan, input);

  // Both all-reduces start now: the uncompressed tensors, packed, and every P, packed.
  std::vector<at::Tensor> flat_parts;
  for (const at::Tensor& t : plan.uncompressed) flat_parts.push_back(t.reshape({-1}));
  at::Tensor packed = flat_parts.empty() ? at::empty({0}, input.options()) : at::cat(flat_parts);
  Work packed_work = all_reduce_counted(*state, packed);
  Work p_work = all_reduce_counted(*state, p_all);

  return TensorFuture::after(packed_work, packed)
      .then([targets = std::move(plan.targets), world](at::Tensor reduced) {
        return unpack_averaged(targets, world, std::move(reduced));
      })
      .then([state, matrices = std::move(plan.matrices), p_mem = p_all, q_mem = q_all, p_work,
             input, source, world, index](at::Tensor) mutable {
        second_projection(*state, matrices, p_mem, q_mem, p_work, world);
        if (state->options.use_error_feedback) source.sub_(input);  // the error, in place
        if (!state->options.warm_start) {
          state->p.erase(index);
          state->q.erase(index);
        }
        return input;
      });
}

}  // namespace

CommHook powerSGD(std::shared_ptr<PowerSGDState> state) {
  if (!state) throw Error("PowerSGD: state is null");
  if (!state->group) throw Error("PowerSGD: process group is null");
  return [state](GradBucket& bucket) -> TensorFuture {
    const bool compress = state->iter >= state->options.start_powerSGD_iter;
    if (bucket.is_last()) ++state->iter;  // every decision of this iteration is taken below
    if (compress) return compress_bucket(state, bucket);
    // Warm-up: plain averaging all-reduce.
    at::Tensor input = bucket.buffer();
    input.div_(state->group->size());
    state->bytes_reduced += bytes_of(input);
    return TensorFuture::after(state->group->all_reduce_async(input), input);
  };
}

}  // namespace hooks
}  // namespace ddprun
