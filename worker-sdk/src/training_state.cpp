#include "training_state.hpp"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <array>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>

namespace ddprun::detail {
namespace {

namespace optim = torch::optim;

// ---- LibTorch's archive -------------------------------------------------------------------

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key) {
  torch::Tensor t;
  archive.read(key, t);
  return t.item<int64_t>();
}

std::string shape_text(const at::Tensor& t) {
  std::ostringstream s;
  s << t.scalar_type() << " " << t.sizes();
  return s.str();
}

void check_fits(const std::string& name, bool is_buffer, const at::Tensor& target,
                const at::Tensor& saved) {
  if (saved.sizes() != target.sizes() || saved.scalar_type() != target.scalar_type()) {
    throw Error(std::string(is_buffer ? "buffer " : "parameter ") + name + " is " +
                shape_text(target) + " in the model but " + shape_text(saved) +
                " in the checkpoint");
  }
}

// One saved tensor copied into `target` (a parameter or buffer of the model).
void copy_saved(torch::serialize::InputArchive& archive, const std::string& name,
                const std::string& key, at::Tensor& target, bool is_buffer) {
  at::Tensor saved;  // undefined: the archive hands over its tensor instead of set_()ting ours
  archive.read(key, saved, is_buffer);
  if (!target.defined()) return;  // an optional buffer (e.g. BatchNorm without running stats)
  check_fits(name, is_buffer, target, saved);
  target.copy_(saved);
}

// The model's state restored in place, as Python's load_state_dict does: every parameter and
// buffer keeps its tensor (storage, gradient accumulator, DDP's hooks, the views ZeRO and DDP
// made of it), only its values change. Module::load would set_() each one to the archive's
// tensor instead, which detaches the parameters from a DistributedDataParallel that wraps them.
// Same archive layout as Module::save: own parameters, own buffers, one sub-archive per child.
void restore_module(torch::nn::Module& module, torch::serialize::InputArchive& archive,
                    const std::string& prefix) {
  at::NoGradGuard no_grad;
  for (auto& item : module.named_parameters(/*recurse=*/false)) {
    copy_saved(archive, prefix + item.key(), item.key(), item.value(), false);
  }
  for (auto& item : module.named_buffers(/*recurse=*/false)) {
    copy_saved(archive, prefix + item.key(), item.key(), item.value(), true);
  }
  for (const auto& child : module.named_children()) {
    torch::serialize::InputArchive child_archive;
    archive.read(child.key(), child_archive);
    restore_module(*child.value(), child_archive, prefix + child.key() + ".");
  }
}

TrainingProgress restore_archive(const char* bytes, size_t size, c10::Device device,
                                 torch::nn::Module& model, optim::Optimizer& optimizer) {
  torch::serialize::InputArchive archive, model_archive, optimizer_archive, extra;
  archive.load_from(bytes, size, device);
  TrainingProgress progress;
  progress.epoch = read_int(archive, "epoch");
  progress.step = read_int(archive, "step");
  archive.read("extra", extra);
  for (const auto& key : extra.keys()) progress.extra[key] = read_int(extra, key);
  archive.read("model", model_archive);
  archive.read("optimizer", optimizer_archive);
  restore_module(model, model_archive, "");
  optimizer.load(optimizer_archive);
  return progress;
}

// ---- The raw layout -----------------------------------------------------------------------
//
//   "DDPRUN-STATE1\n", u64 header length, u64 data length, header, zeros to a multiple of
//   kAlign, data (the lengths first: a short file is refused before anything is restored)
//
// The header (native byte order; a string is a u32 length and its bytes, a tensor is i8 dtype,
// u8 rank, i64 sizes, u64 offset into the data, u64 length):
//   i64 epoch, i64 step, u32 n, n x (string name, i64 value)
//   u32 n, n x (u8 0 parameter / 1 buffer, string qualified name, tensor)
//   string optimizer kind; "archive": u64 offset, u64 length of LibTorch's archive in the data;
//     else u32 groups, each: u32 n, n x f64 option, u32 params, each: u8 has state, and where
//     it has: i64 step, then per state tensor u8 defined and the tensor where it is

constexpr char kMagic[] = "DDPRUN-STATE1\n";
constexpr size_t kMagicSize = sizeof(kMagic) - 1;
constexpr size_t kAlign = 64;
const char kZeros[kAlign] = {};

size_t aligned(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

class Writer {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    put(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

// Reads the header; any read past its end is a truncated or foreign state.
class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), end_(p + n) {}
  template <typename T>
  T get() {
    T v;
    need(sizeof v);
    std::memcpy(&v, p_, sizeof v);
    p_ += sizeof v;
    return v;
  }
  std::string str() {
    const auto n = get<uint32_t>();
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }

 private:
  void need(size_t n) const {
    if (static_cast<size_t>(end_ - p_) < n) throw std::runtime_error("the header ends early");
  }
  const char* p_;
  const char* end_;
};

bool raw_dtype(at::ScalarType t) {
  switch (t) {
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
    case at::kHalf:
    case at::kFloat:
    case at::kDouble:
    case at::kBool:
    case at::kBFloat16:
    case at::kComplexFloat:
    case at::kComplexDouble:
      return true;
    default:
      return false;
  }
}

// The tensors' bytes of a raw state being written: where each goes and what keeps it alive.
class DataWriter {
 public:
  explicit DataWriter(RawTrainingState& state) : state_(state) {}
  // False for a tensor the raw layout cannot hold.
  bool tensor(Writer& w, const at::Tensor& t) {
    if (t.layout() != at::kStrided || t.is_quantized() || !raw_dtype(t.scalar_type())) {
      return false;
    }
    at::Tensor c = t;
    if (!c.is_cpu() || !c.is_contiguous() || c.is_conj() || c.is_neg()) {
      c = c.detach().resolve_conj().resolve_neg().to(at::kCPU).contiguous();
    }
    const size_t n = c.nbytes();
    w.put(static_cast<int8_t>(c.scalar_type()));
    w.put(static_cast<uint8_t>(c.dim()));
    for (int64_t s : c.sizes()) w.put(s);
    w.put(static_cast<uint64_t>(add(c.data_ptr(), n)));
    w.put(static_cast<uint64_t>(n));
    state_.keep.push_back(std::move(c));
    return true;
  }
  uint64_t add(const void* p, size_t n) {
    if (const size_t pad = aligned(size_) - size_) {
      data_.push_back({const_cast<char*>(kZeros), pad});
      size_ += pad;
    }
    const size_t at = size_;
    if (n) data_.push_back({const_cast<void*>(p), n});
    size_ += n;
    return at;
  }
  size_t size() const { return size_; }
  std::vector<struct iovec>& parts() { return data_; }

 private:
  RawTrainingState& state_;
  std::vector<struct iovec> data_;
  size_t size_ = 0;
};

// A tensor of a raw state, read back: a CPU tensor of its own (the bytes copied out of the
// buffer, which need not be aligned for the dtype).
class DataReader {
 public:
  DataReader(const char* data, size_t size) : data_(data), size_(size) {}
  at::Tensor tensor(Reader& r) {
    const auto dtype = static_cast<at::ScalarType>(r.get<int8_t>());
    const auto rank = r.get<uint8_t>();
    std::vector<int64_t> sizes(rank);
    uint64_t numel = 1;
    for (auto& s : sizes) {
      s = r.get<int64_t>();
      if (s < 0 || (s && numel > (uint64_t{1} << 58) / static_cast<uint64_t>(s))) {
        throw std::runtime_error("a tensor's shape is out of range");
      }
      numel *= static_cast<uint64_t>(s);
    }
    const auto offset = r.get<uint64_t>(), n = r.get<uint64_t>();
    if (!raw_dtype(dtype) || n != numel * c10::elementSize(dtype) || offset > size_ ||
        n > size_ - offset) {
      throw std::runtime_error("a tensor's type or place does not fit the data");
    }
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype));
    if (n) std::memcpy(t.data_ptr(), data_ + offset, n);
    return t;
  }
  std::pair<const char*, size_t> blob(Reader& r) {
    const auto offset = r.get<uint64_t>(), n = r.get<uint64_t>();
    if (offset > size_ || n > size_ - offset)
      throw std::runtime_error("the archive lies past the data");
    return {data_ + offset, static_cast<size_t>(n)};
  }

 private:
  const char* data_;
  size_t size_;
};

// A parameter's entry in an optimizer's state. LibTorch 1.x keys it by its TensorImpl's
// address as text, 2.x by the address itself.
template <typename StateMap>
auto state_key(const StateMap&, const at::Tensor& p) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    return c10::str(p.unsafeGetTensorImpl());
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// The optimizers with a raw codec: their options as numbers, a parameter's state as its step
// counter (0 where it has none) and a fixed list of tensors (undefined where absent).
template <typename Opt, typename Opts, typename St>
struct Kind {
  using Optimizer = Opt;
  using Options = Opts;
  using State = St;
};

struct Sgd : Kind<optim::SGD, optim::SGDOptions, optim::SGDParamState> {
  static constexpr const char* kName = "sgd";
  static std::vector<double> options(const Options& o) {
    return {o.lr(), o.momentum(), o.dampening(), o.weight_decay(), double(o.nesterov())};
  }
  static void set_options(Options& o, const std::vector<double>& v) {
    o.lr(v.at(0)).momentum(v.at(1)).dampening(v.at(2)).weight_decay(v.at(3)).nesterov(v.at(4) != 0);
  }
  static int64_t step(const State&) { return 0; }
  static std::vector<at::Tensor> tensors(const State& s) { return {s.momentum_buffer()}; }
  static void set(State& s, int64_t, const std::vector<at::Tensor>& t) {
    s.momentum_buffer(t.at(0));
  }
};

template <typename Opt, typename Opts, typename St, const char* Name>
struct AdamFamily : Kind<Opt, Opts, St> {
  using Options = Opts;
  using State = St;
  static constexpr const char* kName = Name;
  static std::vector<double> options(const Options& o) {
    return {o.lr(),  std::get<0>(o.betas()), std::get<1>(o.betas()),
            o.eps(), o.weight_decay(),       double(o.amsgrad())};
  }
  static void set_options(Options& o, const std::vector<double>& v) {
    o.lr(v.at(0))
        .betas(std::make_tuple(v.at(1), v.at(2)))
        .eps(v.at(3))
        .weight_decay(v.at(4))
        .amsgrad(v.at(5) != 0);
  }
  static int64_t step(const State& s) { return s.step(); }
  static std::vector<at::Tensor> tensors(const State& s) {
    return {s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()};
  }
  static void set(State& s, int64_t step, const std::vector<at::Tensor>& t) {
    s.step(step).exp_avg(t.at(0)).exp_avg_sq(t.at(1)).max_exp_avg_sq(t.at(2));
  }
};
constexpr char kAdam[] = "adam";
constexpr char kAdamW[] = "adamw";
using Adam = AdamFamily<optim::Adam, optim::AdamOptions, optim::AdamParamState, kAdam>;
using AdamW = AdamFamily<optim::AdamW, optim::AdamWOptions, optim::AdamWParamState, kAdamW>;

struct Adagrad : Kind<optim::Adagrad, optim::AdagradOptions, optim::AdagradParamState> {
  static constexpr const char* kName = "adagrad";
  static std::vector<double> options(const Options& o) {
    return {o.lr(), o.lr_decay(), o.weight_decay(), o.initial_accumulator_value(), o.eps()};
  }
  static void set_options(Options& o, const std::vector<double>& v) {
    o.lr(v.at(0)).lr_decay(v.at(1)).weight_decay(v.at(2)).initial_accumulator_value(v.at(3)).eps(
        v.at(4));
  }
  static int64_t step(const State& s) { return s.step(); }
  static std::vector<at::Tensor> tensors(const State& s) { return {s.sum()}; }
  static void set(State& s, int64_t step, const std::vector<at::Tensor>& t) {
    s.step(step).sum(t.at(0));
  }
};

struct Rmsprop : Kind<optim::RMSprop, optim::RMSpropOptions, optim::RMSpropParamState> {
  static constexpr const char* kName = "rmsprop";
  static std::vector<double> options(const Options& o) {
    return {o.lr(), o.alpha(), o.eps(), o.weight_decay(), o.momentum(), double(o.centered())};
  }
  static void set_options(Options& o, const std::vector<double>& v) {
    o.lr(v.at(0)).alpha(v.at(1)).eps(v.at(2)).weight_decay(v.at(3)).momentum(v.at(4)).centered(
        v.at(5) != 0);
  }
  static int64_t step(const State& s) { return s.step(); }
  static std::vector<at::Tensor> tensors(const State& s) {
    return {s.square_avg(), s.momentum_buffer(), s.grad_avg()};
  }
  static void set(State& s, int64_t step, const std::vector<at::Tensor>& t) {
    s.step(step).square_avg(t.at(0)).momentum_buffer(t.at(1)).grad_avg(t.at(2));
  }
};

// Writes an optimizer of kind K; false for a tensor the raw layout cannot hold.
template <typename K>
bool write_optimizer(Writer& w, DataWriter& data, const optim::Optimizer& optimizer) {
  w.str(K::kName);
  const auto& groups = optimizer.param_groups();
  const auto& state = optimizer.state();
  w.put(static_cast<uint32_t>(groups.size()));
  for (const auto& group : groups) {
    const auto options = K::options(static_cast<const typename K::Options&>(group.options()));
    w.put(static_cast<uint32_t>(options.size()));
    for (double v : options) w.put(v);
    w.put(static_cast<uint32_t>(group.params().size()));
    for (const auto& p : group.params()) {
      auto it = state.find(state_key(state, p));
      w.put(static_cast<uint8_t>(it != state.end()));
      if (it == state.end()) continue;
      const auto& s = static_cast<const typename K::State&>(*it->second);
      w.put(K::step(s));
      for (const auto& t : K::tensors(s)) {
        w.put(static_cast<uint8_t>(t.defined()));
        if (t.defined() && !data.tensor(w, t)) return false;
      }
    }
  }
  return true;
}

template <typename K>
void read_optimizer(Reader& r, DataReader& data, c10::Device device, optim::Optimizer& optimizer) {
  auto& groups = optimizer.param_groups();
  auto& state = optimizer.state();
  const auto n_groups = r.get<uint32_t>();
  if (n_groups != groups.size()) {
    throw Error("the optimizer has " + std::to_string(groups.size()) +
                " parameter groups, the checkpoint " + std::to_string(n_groups));
  }
  const size_t n_tensors = K::tensors(typename K::State()).size();
  for (auto& group : groups) {
    std::vector<double> options(r.get<uint32_t>());
    for (double& v : options) v = r.get<double>();
    if (options.size() != K::options(typename K::Options(0.0)).size()) {
      throw std::runtime_error("the optimizer's options do not fit its kind");
    }
    const auto n_params = r.get<uint32_t>();
    if (n_params != group.params().size()) {
      throw Error("a parameter group of the optimizer has " +
                  std::to_string(group.params().size()) + " parameters, the checkpoint's " +
                  std::to_string(n_params));
    }
    K::set_options(static_cast<typename K::Options&>(group.options()), options);
    for (const auto& p : group.params()) {
      const auto key = state_key(state, p);
      if (!r.get<uint8_t>()) {
        state.erase(key);
        continue;
      }
      const int64_t step = r.get<int64_t>();
      std::vector<at::Tensor> tensors(n_tensors);
      for (auto& t : tensors) {
        if (r.get<uint8_t>()) t = data.tensor(r).to(device);
      }
      auto s = std::make_unique<typename K::State>();
      K::set(*s, step, tensors);
      state[key] = std::move(s);
    }
  }
}

template <typename K>
bool is(const optim::Optimizer& o) {
  return typeid(o) == typeid(typename K::Optimizer);
}

// The optimizer's part of a raw state; false for a tensor the layout cannot hold.
bool write_optimizer(Writer& w, DataWriter& data, RawTrainingState& state,
                     const optim::Optimizer& optimizer) {
  if (is<Sgd>(optimizer)) return write_optimizer<Sgd>(w, data, optimizer);
  if (is<Adam>(optimizer)) return write_optimizer<Adam>(w, data, optimizer);
  if (is<AdamW>(optimizer)) return write_optimizer<AdamW>(w, data, optimizer);
  if (is<Adagrad>(optimizer)) return write_optimizer<Adagrad>(w, data, optimizer);
  if (is<Rmsprop>(optimizer)) return write_optimizer<Rmsprop>(w, data, optimizer);
  // Any other optimizer (ZeroRedundancyOptimizer, LBFGS, a user's): its own archive.
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  state.blob = out.str();
  w.str("archive");
  w.put(static_cast<uint64_t>(data.add(state.blob.data(), state.blob.size())));
  w.put(static_cast<uint64_t>(state.blob.size()));
  return true;
}

void read_optimizer(Reader& r, DataReader& data, c10::Device device, optim::Optimizer& optimizer) {
  const std::string kind = r.str();
  if (kind == "archive") {
    const auto [bytes, n] = data.blob(r);
    torch::serialize::InputArchive archive;
    archive.load_from(bytes, n, device);
    optimizer.load(archive);
    return;
  }
  const bool fits = (kind == Sgd::kName && is<Sgd>(optimizer)) ||
                    (kind == Adam::kName && is<Adam>(optimizer)) ||
                    (kind == AdamW::kName && is<AdamW>(optimizer)) ||
                    (kind == Adagrad::kName && is<Adagrad>(optimizer)) ||
                    (kind == Rmsprop::kName && is<Rmsprop>(optimizer));
  if (!fits)
    throw Error("the checkpoint holds the state of another kind of optimizer (" + kind + ")");
  if (kind == Sgd::kName) return read_optimizer<Sgd>(r, data, device, optimizer);
  if (kind == Adam::kName) return read_optimizer<Adam>(r, data, device, optimizer);
  if (kind == AdamW::kName) return read_optimizer<AdamW>(r, data, device, optimizer);
  if (kind == Adagrad::kName) return read_optimizer<Adagrad>(r, data, device, optimizer);
  read_optimizer<Rmsprop>(r, data, device, optimizer);
}

TrainingProgress restore_raw(const char* bytes, size_t size, c10::Device device,
                             torch::nn::Module& model, optim::Optimizer& optimizer) {
  Reader outer(bytes + kMagicSize, size - kMagicSize);
  const auto header_size = outer.get<uint64_t>(), data_size = outer.get<uint64_t>();
  const size_t header_at = kMagicSize + 2 * sizeof(uint64_t);
  if (header_size > size - header_at || aligned(header_at + header_size) > size ||
      data_size != size - aligned(header_at + header_size)) {
    throw std::runtime_error("its length is not the saved one");
  }
  Reader r(bytes + header_at, header_size);
  const size_t data_at = aligned(header_at + header_size);
  DataReader data(bytes + data_at, data_size);

  TrainingProgress progress;
  progress.epoch = r.get<int64_t>();
  progress.step = r.get<int64_t>();
  for (auto n = r.get<uint32_t>(); n > 0; --n) {
    std::string name = r.str();
    progress.extra[name] = r.get<int64_t>();
  }
  std::unordered_map<std::string, at::Tensor> saved[2];  // parameters, buffers
  for (auto n = r.get<uint32_t>(); n > 0; --n) {
    const auto kind = r.get<uint8_t>();
    std::string name = r.str();
    saved[kind != 0][name] = data.tensor(r);
  }
  {
    at::NoGradGuard no_grad;
    for (const bool is_buffer : {false, true}) {
      const auto items = is_buffer ? model.named_buffers() : model.named_parameters();
      for (const auto& item : items) {
        at::Tensor target = item.value();
        if (!target.defined()) continue;
        auto it = saved[is_buffer].find(item.key());
        if (it == saved[is_buffer].end()) {
          throw Error(std::string(is_buffer ? "buffer " : "parameter ") + item.key() +
                      " is not in the checkpoint");
        }
        check_fits(item.key(), is_buffer, target, it->second);
        target.copy_(it->second);
      }
    }
  }
  read_optimizer(r, data, device, optimizer);
  return progress;
}

}  // namespace

std::string serialize_training_state(const TrainingProgress& progress,
                                     const torch::nn::Module& model,
                                     const optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive, model_archive, optimizer_archive, extra;
  archive.write("epoch", torch::tensor(progress.epoch));
  archive.write("step", torch::tensor(progress.step));
  for (const auto& [name, value] : progress.extra) extra.write(name, torch::tensor(value));
  archive.write("extra", extra);
  model.save(model_archive);
  optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

std::optional<RawTrainingState> raw_training_state(const TrainingProgress& progress,
                                                   const torch::nn::Module& model,
                                                   const optim::Optimizer& optimizer) {
  RawTrainingState state;
  Writer w;
  DataWriter data(state);
  w.put(progress.epoch);
  w.put(progress.step);
  w.put(static_cast<uint32_t>(progress.extra.size()));
  for (const auto& [name, value] : progress.extra) {
    w.str(name);
    w.put(value);
  }
  const auto params = model.named_parameters(), buffers = model.named_buffers();
  uint32_t n = 0;
  for (const auto* items : {&params, &buffers}) {
    for (const auto& item : *items) n += item.value().defined();
  }
  w.put(n);
  for (const auto* items : {&params, &buffers}) {
    for (const auto& item : *items) {
      if (!item.value().defined()) continue;
      w.put(static_cast<uint8_t>(items == &buffers));
      w.str(item.key());
      if (!data.tensor(w, item.value())) return std::nullopt;
    }
  }
  if (!write_optimizer(w, data, state, optimizer)) return std::nullopt;

  const std::string& header = w.bytes();
  state.head.reserve(aligned(kMagicSize + 2 * sizeof(uint64_t) + header.size()));
  state.head.append(kMagic, kMagicSize);
  for (const uint64_t n : {uint64_t{header.size()}, uint64_t{data.size()}}) {
    state.head.append(reinterpret_cast<const char*>(&n), sizeof n);
  }
  state.head += header;
  state.head.resize(aligned(state.head.size()), '\0');
  state.parts.reserve(data.parts().size() + 1);
  state.parts.push_back({state.head.data(), state.head.size()});
  state.parts.insert(state.parts.end(), data.parts().begin(), data.parts().end());
  state.size = state.head.size() + data.size();
  return state;
}

std::string training_state_bytes(const TrainingProgress& progress, const torch::nn::Module& model,
                                 const optim::Optimizer& optimizer) {
  auto raw = raw_training_state(progress, model, optimizer);
  if (!raw) return serialize_training_state(progress, model, optimizer);
  std::string out;
  out.reserve(raw->size);
  for (const auto& part : raw->parts)
    out.append(static_cast<const char*>(part.iov_base), part.iov_len);
  return out;
}

TrainingProgress restore_training_state(const char* bytes, size_t size, c10::Device device,
                                        torch::nn::Module& model, optim::Optimizer& optimizer) {
  if (size >= kMagicSize && std::memcmp(bytes, kMagic, kMagicSize) == 0) {
    return restore_raw(bytes, size, device, model, optimizer);
  }
  return restore_archive(bytes, size, device, model, optimizer);
}

}  // namespace ddprun::detail
