// EPL shared-memory byte queue: segment setup and the lock-free push/pop.
#include "shm_queue.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "ring_errno.h"

namespace epl {
namespace ring {

// Lives at the start of the segment. head/tail count bytes ever pushed/popped;
// they sit on separate cache lines so producer and consumer do not share one.
struct ShmQueue::Control {
  uint64_t magic;
  uint64_t nonce;
  uint64_t capacity;
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
};

namespace {

const uint64_t kShmMagic = 0x45504c53484d5131ULL;  // "EPLSHMQ1"
const size_t kHeaderBytes = 256;                   // Control, padded; data starts aligned
// Bytes published per Push/Pop: small enough that the consumer copies one piece
// out while the producer copies the next one in.
const size_t kPiece = 256 << 10;

static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t),
              "queue counters must be plain 64-bit words in shared memory");

// The nonce is already random: with the pid it makes the name unique on this host.
std::string NewName(uint64_t nonce) {
  char buffer[64];
  snprintf(buffer, sizeof(buffer), "/epl-ring-%d-%016llx", static_cast<int>(getpid()),
           static_cast<unsigned long long>(nonce));
  return buffer;
}

}  // namespace

ShmQueue::ShmQueue(void* base, size_t mapped)
    : base_(base),
      mapped_(mapped),
      control_(static_cast<Control*>(base)),
      data_(static_cast<char*>(base) + kHeaderBytes),
      capacity_(static_cast<Control*>(base)->capacity) {}

ShmQueue::~ShmQueue() { munmap(base_, mapped_); }

void ShmQueue::Unlink(const std::string& name) {
  if (!name.empty()) shm_unlink(name.c_str());
}

std::unique_ptr<ShmQueue> ShmQueue::Create(uint64_t nonce, size_t capacity, std::string* name,
                                           std::string* error) {
  static_assert(sizeof(Control) <= kHeaderBytes, "Control must fit in the header");
  *name = NewName(nonce);
  int fd = shm_open(name->c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    *error = Errno("shm_open " + *name);
    return nullptr;
  }
  size_t mapped = kHeaderBytes + capacity;
  // posix_fallocate reserves the pages now: a full /dev/shm is an error here,
  // not a SIGBUS in the middle of a training step.
  int rc = ftruncate(fd, mapped) == 0 ? posix_fallocate(fd, 0, mapped) : errno;
  void* base = rc == 0 ? mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                       : MAP_FAILED;
  close(fd);
  if (base == MAP_FAILED) {
    *error = rc != 0 ? Errno("reserving " + std::to_string(mapped) + " bytes in " + *name, rc)
                     : Errno("mmap " + *name);
    Unlink(*name);
    return nullptr;
  }
  Control* control = new (base) Control();
  control->nonce = nonce;
  control->capacity = capacity;
  control->head.store(0, std::memory_order_relaxed);
  control->tail.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  control->magic = kShmMagic;
  return std::unique_ptr<ShmQueue>(new ShmQueue(base, mapped));
}

std::unique_ptr<ShmQueue> ShmQueue::Open(const std::string& name, uint64_t nonce,
                                         std::string* error) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    *error = Errno("shm_open " + name);
    return nullptr;
  }
  // The reason is printed when the link falls back to TCP, so keep each cause apart.
  struct stat info {};
  void* base = MAP_FAILED;
  if (fstat(fd, &info) != 0) {
    *error = Errno("fstat " + name);
  } else if (static_cast<size_t>(info.st_size) <= kHeaderBytes) {
    *error = name + " is too small (" + std::to_string(info.st_size) + " bytes)";
  } else {
    base = mmap(nullptr, info.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) *error = Errno("mmap " + name);
  }
  close(fd);
  if (base == MAP_FAILED) return nullptr;
  const Control* control = static_cast<const Control*>(base);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (control->magic != kShmMagic || control->nonce != nonce ||
      control->capacity + kHeaderBytes != static_cast<uint64_t>(info.st_size)) {
    munmap(base, info.st_size);
    *error = name + " is not the segment the peer offered";
    return nullptr;
  }
  return std::unique_ptr<ShmQueue>(new ShmQueue(base, info.st_size));
}

size_t ShmQueue::Push(const char* data, size_t bytes) {
  uint64_t head = control_->head.load(std::memory_order_relaxed);
  uint64_t tail = control_->tail.load(std::memory_order_acquire);
  size_t n = std::min<size_t>(std::min(bytes, kPiece), capacity_ - (head - tail));
  if (n == 0) return 0;
  size_t at = head % capacity_;
  size_t first = std::min(n, capacity_ - at);
  std::memcpy(data_ + at, data, first);
  std::memcpy(data_, data + first, n - first);
  control_->head.store(head + n, std::memory_order_release);
  return n;
}

size_t ShmQueue::Pop(char* data, size_t bytes) {
  uint64_t tail = control_->tail.load(std::memory_order_relaxed);
  uint64_t head = control_->head.load(std::memory_order_acquire);
  size_t n = std::min<size_t>(std::min(bytes, kPiece), head - tail);
  if (n == 0) return 0;
  size_t at = tail % capacity_;
  size_t first = std::min(n, capacity_ - at);
  std::memcpy(data, data_ + at, first);
  std::memcpy(data + first, data_, n - first);
  control_->tail.store(tail + n, std::memory_order_release);
  return n;
}

}  // namespace ring
}  // namespace epl
