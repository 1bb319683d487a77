#include "memory_save.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "ddprun/process_group.hpp"

// How a save to memory goes. A new tmpfs page costs more to get than the copy into it, so
// the file of the save before the last is written over: the rename that puts a save in place
// is an exchange (renameat2's RENAME_EXCHANGE), which leaves the save it replaced at the temp
// path for the next save. The process keeps both files open and mapped between saves, so a
// save no larger than the file it writes over is: lock it, copy into its mapped pages (no
// page-by-page lookup as write() makes; stores that bypass the cache, see copy_around_cache),
// swap it in, unlock it. The job's bound (a scan of the directory) is only looked at when a
// save grows. No fsync: there is no disk under it.
//
// Atomic as a file save: `target` is only ever replaced by a complete file in one rename; a
// save killed half-way leaves the temp file, which the agent removes before the next attempt.
// The agent sends saves to another node while the workers run, holding a shared flock on a
// file while it reads it (replica_io::open_saved); a save takes an exclusive one, without
// waiting, on the file it writes into, and where that fails writes a new file instead.
// A file whose size changes gets its pages allocated (fallocate) before it is mapped, so a
// full tmpfs is an error from the save, never a SIGBUS in the copy.

namespace ddprun::detail {
namespace {

namespace fs = std::filesystem;

// One file of a name's saves, held open (and, once this process writes it, mapped) between
// saves. An unmapped one is an earlier process's: its size is unknown, the bound is checked.
struct Held {
  int fd = -1;
  ino_t inode = 0;
  size_t size = 0;      // its length, where it is mapped: the save in it
  char* map = nullptr;  // its `size` bytes, shared with the file

  void release() {
    if (map) ::munmap(map, size);
    if (fd >= 0) ::close(fd);
    *this = Held{};
  }
};

// The files of one target's saves: the one in place and the previous one, at the temp path.
struct Files {
  pid_t pid = 0;
  Held current, spare;
};

std::mutex files_mutex;
std::map<std::string, Files> held_files;  // by target

uint64_t blocks_of(const fs::path& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
}

// The temp file, locked: a file left at the temp path (an earlier process's save) to write
// over, or a new one where there is none or the agent holds it.
Held open_temp(const fs::path& temp) {
  int fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) fail(temp, "cannot create", errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    ::unlink(temp.c_str());
    fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) fail(temp, "cannot create", errno);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      fail(temp, "cannot lock", err);
    }
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(temp, "cannot stat", err);
  }
  Held file;
  file.fd = fd;
  file.inode = st.st_ino;
  return file;
}

// The spare, locked, where it is still the file at the temp path and nobody reads it; else
// it is let go and a file is opened there.
Held take_spare(Files& files, const fs::path& temp) {
  Held spare = files.spare;
  files.spare = Held{};
  if (spare.fd >= 0) {
    struct stat st;
    if (::stat(temp.c_str(), &st) == 0 && st.st_ino == spare.inode &&
        ::flock(spare.fd, LOCK_EX | LOCK_NB) == 0) {
      return spare;
    }
    spare.release();
  }
  return open_temp(temp);
}

// Gives `file` the length `size`, its pages allocated, and maps it.
void resize_and_map(Held& file, size_t size, const fs::path& path) {
  if (file.map) ::munmap(file.map, file.size);
  file.map = nullptr;
  if (::ftruncate(file.fd, static_cast<off_t>(size)) != 0) fail(path, "cannot truncate", errno);
  file.size = size;
  if (const int err = ::posix_fallocate(file.fd, 0, static_cast<off_t>(size))) {
    fail(path, "cannot get the memory for this save", err);
  }
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, file.fd, 0);
  if (map == MAP_FAILED) fail(path, "cannot map", errno);
  file.map = static_cast<char*>(map);
}

// Swaps the two names in one step. False, with nothing changed, where `target` does not exist
// yet or the kernel or file system cannot swap.
bool exchange(const fs::path& temp, const fs::path& target) {
  static std::atomic<bool> unsupported{false};
  if (unsupported) return false;
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    return true;
  }
  if (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) {
    unsupported = true;
  } else if (errno != ENOENT) {
    fail(target, "cannot rename over", errno);
  }
  return false;
}

fs::path temp_path(const fs::path& target) {
  std::string name(1, '.');
  name += target.filename().string();
  name += '.';
  name += std::to_string(::getpid());
  name += ".tmp";
  return target.parent_path() / name;
}

// Copies `n` bytes to `to` with stores that bypass the cache where the CPU has them: the file's
// pages are not read again by this process, and between two saves a training step has pushed
// them out of the cache, so an ordinary copy would first read each line it writes (and push
// the step's own data out in turn). The caller fences (flush_copies) before the data is used.
void copy_around_cache(char* to, const char* from, size_t n) {
#if defined(__SSE2__)
  while (n && (reinterpret_cast<uintptr_t>(to) & 15)) {
    *to++ = *from++;
    --n;
  }
  for (; n >= 64; n -= 64, to += 64, from += 64) {
    const __m128i* src = reinterpret_cast<const __m128i*>(from);
    __m128i* dst = reinterpret_cast<__m128i*>(to);
    const __m128i a = _mm_loadu_si128(src), b = _mm_loadu_si128(src + 1),
                  c = _mm_loadu_si128(src + 2), d = _mm_loadu_si128(src + 3);
    _mm_stream_si128(dst, a);
    _mm_stream_si128(dst + 1, b);
    _mm_stream_si128(dst + 2, c);
    _mm_stream_si128(dst + 3, d);
  }
#endif
  std::memcpy(to, from, n);
}

void flush_copies() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Writes `raw` into `spare` and puts it in `target`'s place; returns whether the names were
// exchanged (else the file that was in place is gone). `used`: the bound's count of the other
// files, where `check` says the bound is to be looked at.
bool write_and_swap(Held& spare, const RawTrainingState& raw, const fs::path& target,
                    const fs::path& temp, uint64_t limit, bool check, uint64_t& used) {
  if (check) {
    used = memory_used_besides(target.parent_path(), target, temp);
    if (used + raw.size > limit) fail_over_bound(target, raw.size, used, limit);
  }
  if (!spare.map || spare.size != raw.size) resize_and_map(spare, raw.size, temp);
  char* at = spare.map;
  for (const auto& part : raw.parts) {
    copy_around_cache(at, static_cast<const char*>(part.iov_base), part.iov_len);
    at += part.iov_len;
  }
  flush_copies();
  if (check) {  // what the copy took, in pages
    const uint64_t blocks = blocks_of(temp);
    if (used + blocks > limit) fail_over_bound(target, blocks, used, limit);
  }
  const bool swapped = exchange(temp, target);
  if (!swapped && ::rename(temp.c_str(), target.c_str()) != 0) {
    fail(target, "cannot rename over", errno);
  }
  return swapped;
}

}  // namespace

uint64_t memory_used_besides(const fs::path& dir, const fs::path& a, const fs::path& b) {
  uint64_t used = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    struct stat st;
    if (entry.path() != a && entry.path() != b && ::lstat(entry.path().c_str(), &st) == 0 &&
        S_ISREG(st.st_mode)) {
      used += static_cast<uint64_t>(st.st_blocks) * 512;
    }
  }
  return used;
}

void fail(const fs::path& path, const std::string& what, int err) {
  throw Error("checkpoint " + path.string() + ": " + what +
              (err ? std::string(": ") + std::strerror(err) : std::string()));
}

void fail_over_bound(const fs::path& target, uint64_t bytes, uint64_t used, uint64_t limit) {
  fail(target, "this save (" + std::to_string(bytes >> 20) +
                   " MiB) would pass the job's in-memory bound of " + std::to_string(limit >> 20) +
                   " MiB (" + std::to_string(used >> 20) +
                   " MiB in use); raise ddprun --memory-checkpoints");
}

void save_in_memory(const fs::path& target, const RawTrainingState& raw, uint64_t limit) {
  std::lock_guard<std::mutex> lock(files_mutex);
  Files& files = held_files[target.string()];
  if (files.pid != ::getpid()) {  // new, or a parent's, inherited through a fork
    files.current.release();
    files.spare.release();
    files.pid = ::getpid();
  }
  const fs::path temp = temp_path(target);
  Held spare = take_spare(files, temp);
  const bool check = limit && (!spare.map || raw.size > spare.size);
  uint64_t used = 0;
  bool swapped = false;
  try {
    swapped = write_and_swap(spare, raw, target, temp, limit, check, used);
  } catch (...) {
    spare.release();
    ::unlink(temp.c_str());
    throw;
  }
  ::flock(spare.fd, LOCK_UN);  // in place now: the agent may read it
  Held previous = files.current;
  files.current = spare;
  if (swapped && check && used + blocks_of(target) + blocks_of(temp) > limit) {
    ::unlink(temp.c_str());  // no room to keep the previous save for the next one
    swapped = false;
  }
  if (swapped) {
    files.spare = previous;  // none where the file in place was not this process's
  } else {
    previous.release();
  }
}

}  // namespace ddprun::detail
