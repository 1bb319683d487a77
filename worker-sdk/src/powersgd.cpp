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
    throw Error(what + "start_powerSGD_iter must be > 1 with use_error_feedback or warm_start "
                "(got " + std::to_string(options.start_powerSGD_iter) +
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

CommHook powerSGD(std::shared_ptr<PowerSGDState> state) {
  if (!state) throw Error("PowerSGD: state is null");
  if (!state->group) throw Error("PowerSGD: process group is null");
  return [state](GradBucket& bucket) -> TensorFuture {
    ProcessGroup& group = *state->group;
    const PowerSGDOptions& o = state->options;
    const int world = group.size();
    at::Tensor input = bucket.buffer();
    const bool compress = state->iter >= o.start_powerSGD_iter;
    if (bucket.is_last()) ++state->iter;  // every decision of this iteration is taken below
    if (!compress) {
      // Warm-up: plain averaging all-reduce.
      input.div_(world);
      state->bytes_reduced += bytes_of(input);
      return TensorFuture::after(group.all_reduce_async(input), input);
    }

    const size_t index = bucket.index();
    // With error feedback, compression starts from gradient + last error, formed in the error
    // buffer itself, which becomes the new error (that minus the result) at the end: one buffer
    // reused in place, and the bucket is only written with the result.
    at::Tensor source = input;
    if (o.use_error_feedback) {
      at::Tensor& error = state->error[index];
      if (error.defined() && error.numel() == input.numel()) {
        error.add_(input);
      } else {
        error = input.clone();
      }
      source = error;
    }

    // Which tensors are worth compressing.
    std::vector<Compressed> matrices;
    std::vector<at::Tensor> uncompressed, targets;  // targets: the same tensors in the bucket
    int64_t p_size = 0, q_size = 0;
    for (const at::Tensor& grad : bucket.gradients()) {
      const at::Tensor g = same_place(grad, input, source);
      const int64_t n = g.dim() >= 1 ? g.size(0) : 0;
      const int64_t m = n > 0 ? g.numel() / n : 0;
      const int64_t r =
          std::min<int64_t>({n, m, static_cast<int64_t>(o.matrix_approximation_rank)});
      state->numel_before_compression += g.numel();
      if (g.dim() >= 1 &&
          static_cast<double>((n + m) * r) * o.min_compression_rate < static_cast<double>(n * m)) {
        matrices.push_back(Compressed{g.view({n, m}), grad.view({n, m}), r, p_size, q_size});
        p_size += n * r;
        q_size += m * r;
        state->numel_after_compression += (n + m) * r;
      } else {
        uncompressed.push_back(g);
        targets.push_back(grad);
        state->numel_after_compression += g.numel();
      }
    }

    // P and Q memory: kept per bucket with warm start, and Q's from the last step reused.
    at::Tensor& p_all = state->p[index];
    at::Tensor& q_all = state->q[index];
    const bool fresh = !o.warm_start || !p_all.defined() || p_all.numel() != p_size ||
                       !q_all.defined() || q_all.numel() != q_size;
    if (fresh) {
      p_all = at::empty({p_size}, input.options());
      q_all = at::empty({q_size}, input.options());
      // The same random Q's on every rank: drawn on the CPU from a seed all ranks derive alike.
      at::Generator gen = at::detail::createCPUGenerator(
          derive_seed(o.random_seed, state->random_draws++));
      for (const Compressed& c : matrices) {
        at::Tensor q = slice_matrix(q_all, c.q_offset, c.matrix.size(1), c.rank);
        q.copy_(at::randn(q.sizes(), gen, at::TensorOptions().dtype(input.scalar_type())));
      }
    }
    for (const Compressed& c : matrices) {
      at::Tensor q = slice_matrix(q_all, c.q_offset, c.matrix.size(1), c.rank);
      orthogonalize(q, o.orthogonalization_epsilon);
      at::Tensor p = slice_matrix(p_all, c.p_offset, c.matrix.size(0), c.rank);
      at::mm_out(p, c.matrix, q);  // P = M Q
    }

    // Both all-reduces start now: the uncompressed tensors, packed, and every P, packed.
    std::vector<at::Tensor> flat_parts;
    for (const at::Tensor& t : uncompressed) flat_parts.push_back(t.reshape({-1}));
    at::Tensor packed =
        flat_parts.empty() ? at::empty({0}, input.options()) : at::cat(flat_parts);
    Work packed_work, p_work;
    if (packed.numel() > 0) {
      packed_work = group.all_reduce_async(packed);
      state->bytes_reduced += bytes_of(packed);
    }
    if (p_all.numel() > 0) {
      p_work = group.all_reduce_async(p_all);
      state->bytes_reduced += bytes_of(p_all);
    }

    // The rest runs when DDP waits for this bucket: orthogonalise the summed P's, Q = M^T P
    // (one more all-reduce), M = P Q^T / world.
    at::Tensor p_mem = p_all, q_mem = q_all;
    return TensorFuture::after(packed_work, packed)
        .then([targets, world](at::Tensor reduced) {
          int64_t offset = 0;
          reduced.div_(world);
          for (const at::Tensor& t : targets) {
            at::Tensor dst = t;
            dst.copy_(reduced.narrow(0, offset, t.numel()).view(t.sizes()));
            offset += t.numel();
          }
          return reduced;
        })
        .then([state, matrices, p_mem, q_mem, p_work, input, source, world,
               index](at::Tensor) mutable {
          ProcessGroup& group = *state->group;
          const PowerSGDOptions& o = state->options;
          if (!matrices.empty()) {
            p_work.wait();
            for (const Compressed& c : matrices) {
              at::Tensor p = slice_matrix(p_mem, c.p_offset, c.matrix.size(0), c.rank);
              orthogonalize(p, o.orthogonalization_epsilon);
              at::Tensor q = slice_matrix(q_mem, c.q_offset, c.matrix.size(1), c.rank);
              at::mm_out(q, c.matrix.t(), p);  // Q = M^T P
            }
            state->bytes_reduced += bytes_of(q_mem);
            group.all_reduce_async(q_mem).wait();
            q_mem.div_(world);
            for (const Compressed& c : matrices) {
              at::Tensor p = slice_matrix(p_mem, c.p_offset, c.matrix.size(0), c.rank);
              at::Tensor q = slice_matrix(q_mem, c.q_offset, c.matrix.size(1), c.rank);
              at::Tensor m = c.target;
              at::mm_out(m, p, q.t());  // M ~ P Q^T
            }
          }
          if (o.use_error_feedback) source.sub_(input);  // state->error[index], in place
          if (!o.warm_start) {
            state->p.erase(index);
            state->q.erase(index);
          }
          return input;
        });
  };
}

}  // namespace hooks
}  // namespace ddprun
