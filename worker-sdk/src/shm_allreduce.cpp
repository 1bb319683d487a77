#include "shm_allreduce.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "work_impl.hpp"

namespace ddprun {
namespace {

constexpr uint64_t kMagic = 0x6464707275'6e5348ULL;  // "ddprunSH"
constexpr size_t kControlBytes = 4096;
constexpr size_t kPage = 4096;
constexpr int64_t kAlignElems = 16;  // slices start on 64-byte lines: no false sharing

struct Control {
  uint64_t magic;
  uint64_t token;
  alignas(64) std::atomic<uint32_t> arrived;
  alignas(64) std::atomic<uint32_t> generation;  // futex word: bumped by the last arrival
  alignas(64) std::atomic<uint32_t> failed;      // a rank gave up: the others stop waiting
};
static_assert(sizeof(Control) <= kControlBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free, "atomics must be address-free");

uint32_t* futex_word(std::atomic<uint32_t>& a) {
  return reinterpret_cast<uint32_t*>(&a);
}

void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::milliseconds max) {
  timespec ts{static_cast<time_t>(max.count() / 1000),
              static_cast<long>(max.count() % 1000) * 1000000};
  ::syscall(SYS_futex, futex_word(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  ::syscall(SYS_futex, futex_word(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string link_of(const char* path) {
  char buf[256];
  ssize_t n = ::readlink(path, buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Ranks may share memory only within one kernel instance and one IPC/mount/PID namespace.
std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string boot = read_first_line("/proc/sys/kernel/random/boot_id");
  std::string ipc = link_of("/proc/self/ns/ipc"), mnt = link_of("/proc/self/ns/mnt"),
              pid = link_of("/proc/self/ns/pid");
  if (boot.empty() || ipc.empty() || mnt.empty() || pid.empty()) return "";
  return std::string(host) + "|" + boot + "|" + ipc + "|" + mnt + "|" + pid;
}

int pidfd_open(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

bool process_gone(int pid, int pidfd) {
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;  // readable once the process has exited
  }
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::string stat = read_first_line(("/proc/" + std::to_string(pid) + "/stat").c_str());
  auto paren = stat.rfind(')');
  return stat.empty() ||
         (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z');
}

template <typename T>
void sum_slices(const std::vector<T*>& slots, int64_t begin, int64_t end) {
  if (slots.size() == 2) {
    T* a = slots[0];
    T* b = slots[1];
    for (int64_t i = begin; i < end; ++i) {
      T s = a[i] + b[i];
      a[i] = s;
      b[i] = s;
    }
    return;
  }
  constexpr int64_t kBlock = 2048;
  T tmp[kBlock];
  for (int64_t lo = begin; lo < end; lo += kBlock) {
    const int64_t n = std::min(kBlock, end - lo);
    std::memcpy(tmp, slots[0] + lo, static_cast<size_t>(n) * sizeof(T));
    for (size_t q = 1; q < slots.size(); ++q) {
      const T* src = slots[q] + lo;
      for (int64_t i = 0; i < n; ++i) tmp[i] += src[i];  // rank order: the same sum everywhere
    }
    for (T* dst : slots) std::memcpy(dst + lo, tmp, static_cast<size_t>(n) * sizeof(T));
  }
}

// Rank 0: a new shared memory segment of `size` bytes, its pages reserved (a full /dev/shm
// fails here, not with SIGBUS in the middle of training), mapped at *base with its control
// block written. Its name, or "" when it cannot be made.
std::string create_segment(size_t size, uint64_t token, void** base) {
  std::ostringstream n;
  n << "/ddprun-" << ::getpid() << "-" << std::hex << token;
  const std::string name = n.str();
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return "";
  if (::ftruncate(fd, static_cast<off_t>(size)) == 0 &&
      ::posix_fallocate(fd, 0, static_cast<off_t>(size)) == 0) {
    *base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);  // the mapping keeps the segment
  if (*base == MAP_FAILED) {
    ::shm_unlink(name.c_str());
    return "";
  }
  Control* c = new (*base) Control{};
  c->magic = kMagic;
  c->token = token;
  return name;
}

// The other ranks: rank 0's segment mapped at *base; false if it cannot be, or is not the one.
bool attach_segment(const std::string& name, size_t size, uint64_t token, void** base) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return false;
  *base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (*base == MAP_FAILED) return false;
  const auto* c = static_cast<const Control*>(*base);
  return c->magic == kMagic && c->token == token;
}

// Every rank's pid, and a pidfd for each peer (-1 for this rank); false when a peer's pid is
// not visible from here (not our host after all).
bool open_peers(ProcessGroup& group, std::vector<int>& pids, std::vector<int>& pidfds) {
  const auto pid_texts = group.all_gather_bytes(std::to_string(::getpid()));
  bool ok = true;
  for (int r = 0; r < group.size(); ++r) {
    const int pid = std::stoi(pid_texts[r]);
    pids.push_back(pid);
    int pfd = -1;
    if (r != group.rank() && pid != ::getpid()) {
      pfd = pidfd_open(pid);
      if (pfd < 0 && errno != ENOSYS) ok = false;
    }
    pidfds.push_back(pfd);
  }
  return ok;
}

}  // namespace

struct ShmAllReduce::Segment {
  void* base = MAP_FAILED;
  size_t size = 0;
  size_t slot_bytes = 0;
  ~Segment() {
    if (base != MAP_FAILED) ::munmap(base, size);
  }
  Control* control() const { return static_cast<Control*>(base); }
  char* slot(int r) const {
    return static_cast<char*>(base) + kControlBytes + static_cast<size_t>(r) * slot_bytes;
  }
};

std::unique_ptr<ShmAllReduce> ShmAllReduce::create(ProcessGroup& group, int64_t slot_bytes) {
  const int world = group.size(), rank = group.rank();
  const char* env = std::getenv("DDPRUN_SHM");
  const bool wanted = slot_bytes > 0 && !(env != nullptr && std::string(env) == "0");
  const auto ids = group.all_gather_bytes(wanted ? host_identity() : std::string());
  for (const auto& id : ids) {
    if (id.empty() || id != ids[0]) return nullptr;  // the same verdict on every rank
  }

  auto seg = std::make_shared<Segment>();
  seg->slot_bytes = (static_cast<size_t>(slot_bytes) + kPage - 1) / kPage * kPage;
  seg->size = kControlBytes + seg->slot_bytes * static_cast<size_t>(world);
  std::string name;
  uint64_t token = 0;
  if (rank == 0) {
    std::random_device rd;
    token = (static_cast<uint64_t>(rd()) << 32) | rd();
    name = create_segment(seg->size, token, &seg->base);
  }
  std::string shared = group.broadcast_bytes(name + "\n" + std::to_string(token), 0);
  name = shared.substr(0, shared.find('\n'));
  token = std::stoull(shared.substr(shared.find('\n') + 1));
  if (name.empty()) return nullptr;
  bool ok = rank == 0 || attach_segment(name, seg->size, token, &seg->base);
  std::vector<int> pids, pidfds;
  ok = open_peers(group, pids, pidfds) && ok;
  auto flag = at::full({1}, ok ? 1 : 0, at::kInt);
  group.all_reduce(flag, ReduceOp::kMin);
  if (rank == 0) ::shm_unlink(name.c_str());  // everyone has it mapped (or gave up): no leak
  if (flag.item<int>() == 0) {
    for (int pfd : pidfds) {
      if (pfd >= 0) ::close(pfd);
    }
    return nullptr;
  }
  return std::unique_ptr<ShmAllReduce>(new ShmAllReduce(
      std::move(seg), rank, world, std::move(pidfds), std::move(pids), group.timeout()));
}

ShmAllReduce::ShmAllReduce(std::shared_ptr<Segment> segment, int rank, int world,
                           std::vector<int> peer_pidfds, std::vector<int> peer_pids,
                           std::chrono::milliseconds timeout)
    : segment_(std::move(segment)),
      rank_(rank),
      world_(world),
      pidfds_(std::move(peer_pidfds)),
      pids_(std::move(peer_pids)),
      timeout_(timeout) {
  worker_ = std::thread([this] { run(); });
}

ShmAllReduce::~ShmAllReduce() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  abandon_.store(true);  // an operation stuck on an out-of-step peer must not block us
  cv_.notify_all();
  worker_.join();
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
}

at::Tensor ShmAllReduce::slot_tensor(int64_t offset, int64_t numel, at::ScalarType dtype) {
  void* p = segment_->slot(rank_) + offset;
  std::shared_ptr<Segment> keep = segment_;
  return at::from_blob(
      p, {numel}, [keep](void*) {}, at::TensorOptions().dtype(dtype));
}

Work ShmAllReduce::all_reduce(int64_t offset, int64_t numel, at::ScalarType dtype) {
  auto work = std::make_shared<PromiseWork>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Op{offset, numel, dtype, work});
  }
  cv_.notify_one();
  return Work(work);
}

void ShmAllReduce::run() {
  std::exception_ptr broken;
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_) {  // the owner is going away: nobody waits for the rest
        op.work->fail(std::make_exception_ptr(Error("shared-memory all-reduce shut down")));
        continue;
      }
    }
    if (broken) {
      op.work->fail(broken);
      continue;
    }
    try {
      execute(op);
      op.work->done();
    } catch (...) {
      broken = std::current_exception();  // the ranks are out of step: fail all that follows
      op.work->fail(broken);
    }
  }
}

void ShmAllReduce::execute(const Op& op) {
  barrier();  // every rank's gradients are in its slot
  int64_t chunk = (op.numel + world_ - 1) / world_;
  chunk = (chunk + kAlignElems - 1) / kAlignElems * kAlignElems;
  const int64_t begin = std::min(op.numel, chunk * rank_);
  const int64_t end = std::min(op.numel, begin + chunk);
  if (op.dtype == at::kFloat) {
    std::vector<float*> slots;
    for (int r = 0; r < world_; ++r) {
      slots.push_back(reinterpret_cast<float*>(segment_->slot(r) + op.offset));
    }
    sum_slices(slots, begin, end);
  } else {
    std::vector<double*> slots;
    for (int r = 0; r < world_; ++r) {
      slots.push_back(reinterpret_cast<double*>(segment_->slot(r) + op.offset));
    }
    sum_slices(slots, begin, end);
  }
  barrier();  // every slice is summed into every slot
}

void ShmAllReduce::check_peers() {
  for (int r = 0; r < world_; ++r) {
    if (r == rank_ || pids_[r] == ::getpid()) continue;
    if (process_gone(pids_[r], pidfds_[r])) {
      throw Error("shared-memory all-reduce: rank " + std::to_string(r) + " (pid " +
                  std::to_string(pids_[r]) + ") exited in the middle of a collective");
    }
  }
}

void ShmAllReduce::barrier() {
  Control* c = segment_->control();
  const uint32_t gen = c->generation.load(std::memory_order_acquire);
  if (c->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(world_)) {
    c->arrived.store(0, std::memory_order_relaxed);
    c->generation.fetch_add(1, std::memory_order_release);
    futex_wake_all(c->generation);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int spin = 0; spin < 64; ++spin) {
    if (c->generation.load(std::memory_order_acquire) != gen) return;
  }
  while (c->generation.load(std::memory_order_acquire) == gen) {
    futex_wait(c->generation, gen, std::chrono::milliseconds(20));
    if (c->generation.load(std::memory_order_acquire) != gen) return;
    try {
      if (c->failed.load(std::memory_order_acquire) != 0) {
        throw Error("shared-memory all-reduce: another rank failed");
      }
      if (abandon_.load()) throw Error("shared-memory all-reduce: shut down while waiting");
      check_peers();
      if (std::chrono::steady_clock::now() > deadline) {
        throw Error("shared-memory all-reduce: timed out after " +
                    std::to_string(timeout_.count()) + " ms waiting for the other ranks");
      }
    } catch (...) {
      c->failed.store(1, std::memory_order_release);
      futex_wake_all(c->generation);
      throw;
    }
  }
}

}  // namespace ddprun
