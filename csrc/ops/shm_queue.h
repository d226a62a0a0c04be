// EPL shared-memory byte queue: one direction of a ring link between two members
// on the same host.
//
// Over loopback TCP every byte is copied into the kernel and out again and the
// TCP stack runs on the sending and receiving cores; on a machine whose cores are
// all busy training, that cost is added to every step. A single-producer,
// single-consumer queue in a POSIX shared-memory segment moves each byte with
// one copy in and one copy out, at memory speed.
//
// The producer creates the segment and sends its name and a random nonce over the
// ring's TCP connection; the consumer maps it only if the nonce in the segment
// matches, so a name that happens to exist on another machine is never used.
// Both sides unlink the name as soon as the handshake ends, so nothing is left in
// /dev/shm when a process dies later.
#ifndef EPL_CSRC_OPS_SHM_QUEUE_H_
#define EPL_CSRC_OPS_SHM_QUEUE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace epl {
namespace ring {

class ShmQueue {
 public:
  // Producer side: creates and maps a new segment with `capacity` data bytes.
  // On failure returns nullptr and sets `error` (the caller falls back to TCP).
  static std::unique_ptr<ShmQueue> Create(uint64_t nonce, size_t capacity, std::string* name,
                                          std::string* error);
  // Consumer side: maps the segment `name` if it carries `nonce`.
  static std::unique_ptr<ShmQueue> Open(const std::string& name, uint64_t nonce,
                                        std::string* error);
  // Removes the name (the mapping stays valid); safe to call twice.
  static void Unlink(const std::string& name);

  ~ShmQueue();

  // Non-blocking: copies as many bytes as fit (Push) or are available (Pop) and
  // returns how many moved; 0 means "try again later".
  size_t Push(const char* data, size_t bytes);
  size_t Pop(char* data, size_t bytes);

 private:
  struct Control;
  ShmQueue(void* base, size_t mapped);

  void* base_;
  size_t mapped_;
  Control* control_;
  char* data_;
  size_t capacity_;
};

}  // namespace ring
}  // namespace epl

#endif  // EPL_CSRC_OPS_SHM_QUEUE_H_
