// EPL ring transport: TCP connections between the members of one collective group.
//
// Each member (a device taking part in a group) listens on an ephemeral port,
// connects to its successor in the ring and accepts its predecessor. Data moves
// with a poll()-driven full-duplex loop, so a member sends to its successor and
// receives from its predecessor at the same time without extra threads, and a
// peer that stops responding turns into an error after `timeout` seconds
// instead of a hang.
//
// After the TCP handshake, each link (member -> successor) is upgraded to a
// shared-memory queue when both ends can map the same segment, which is the
// case exactly when they run on the same host (see shm_queue.h). The TCP
// connection stays open beside it: its closing tells a member that the peer's
// process is gone. Links that cannot be upgraded keep using TCP, and the member
// that hit the failure keeps the reason for the kernel to report (LinkFallback).
#ifndef EPL_CSRC_OPS_RING_TRANSPORT_H_
#define EPL_CSRC_OPS_RING_TRANSPORT_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shm_queue.h"

namespace epl {
namespace ring {

// Result of a transport call: empty message means success.
struct Result {
  std::string error;
  bool ok() const { return error.empty(); }
  static Result Ok() { return Result(); }
  static Result Fail(const std::string& message) {
    Result r;
    r.error = message;
    return r;
  }
};

// Header sent before every payload so that members that disagree on which
// collective runs next fail loudly instead of exchanging the wrong bytes.
struct Header {
  uint64_t magic;
  uint64_t instance;
  uint64_t step;
  uint64_t bytes;
};

// A link that stays on TCP although shared memory was asked for. Recorded by the
// end that saw the failure (the producer when it cannot create the segment, the
// consumer when it cannot map it), so each link is explained exactly once.
struct LinkFallback {
  std::string link;    // "rank 0 (host:port) -> rank 1 (host:port)"
  std::string reason;  // e.g. "reserving 2097408 bytes in /epl-ring-...: No space left on device"
  // Both ends name the same host, so shared memory should have worked. Otherwise
  // the failure is the normal sign of a peer on another machine.
  bool same_host;
};

class Member {
 public:
  Member(const std::string& communicator, int rank, int size);
  ~Member();

  // Binds 0.0.0.0:0 (once) and returns the port to publish to the other members.
  Result Listen(int* port);
  // Connects to the successor and accepts the predecessor, then upgrades the
  // links to shared memory where possible (when `shared_memory`). Idempotent for
  // the same ports; reconnects if the published ports changed.
  Result Connect(const std::vector<int>& ports, const std::vector<std::string>& hosts,
                 double timeout, bool shared_memory);
  // Sends `send_bytes` to the successor while receiving `recv_bytes` from the
  // predecessor; both framed with a Header checked against (instance, step).
  Result Exchange(uint64_t instance, uint64_t step, const char* send, size_t send_bytes,
                  char* recv, size_t recv_bytes, double timeout);

  // Fallbacks recorded since the last call. A link is recorded at most once per
  // process, however often the ring is set up again, so the log is not flooded.
  std::vector<LinkFallback> TakeFallbacks();

  // Runs `work` on this member's own thread, in submission order. Collectives of
  // one member never run concurrently, and none occupies a TF executor thread.
  void Submit(std::function<void()> work);

  // Reusable buffers (slot 0 or 1) for this member's collectives, which run one
  // at a time on its thread: a fresh multi-megabyte buffer per collective would
  // page-fault through all of its memory on every training step.
  char* Scratch(int slot, size_t bytes);

  bool connected() const { return next_fd_ >= 0 && prev_fd_ >= 0; }
  // Bit 0: connected; bit 1: link to the successor uses shared memory;
  // bit 2: link from the predecessor uses shared memory.
  int LinkState() const;
  int rank() const { return rank_; }
  int next() const { return (rank_ + 1) % size_; }          // successor's rank
  int prev() const { return (rank_ + size_ - 1) % size_; }  // predecessor's rank
  int size() const { return size_; }
  const std::string& communicator() const { return communicator_; }
  std::mutex& mutex() { return run_mu_; }
  std::string PeerName(int peer) const;

 private:
  void CloseRing();
  Result ExchangeOnce(uint64_t instance, uint64_t step, const char* send, size_t send_bytes,
                      char* recv, size_t recv_bytes, double timeout);
  Result ConnectNext(const std::string& host, int port, double timeout);
  Result AcceptPrev(double timeout);
  Result UpgradeLinks(bool shared_memory, double deadline);
  void NoteFallback(int from, int to, const std::string& reason);
  long SendSome(const char* data, size_t bytes, std::string* error);
  long RecvSome(char* data, size_t bytes, std::string* error);
  Result WaitForLinks(bool want_send, bool want_recv, double idle_seconds);

  std::string communicator_;
  int rank_;
  int size_;
  int listen_fd_ = -1;
  int listen_port_ = 0;
  int next_fd_ = -1;
  int prev_fd_ = -1;
  std::unique_ptr<ShmQueue> next_shm_;  // set when the link to the successor is upgraded
  std::unique_ptr<ShmQueue> prev_shm_;  // set when the link from the predecessor is upgraded
  std::vector<LinkFallback> fallbacks_;  // guarded by setup_mu_
  bool next_fallback_noted_ = false;      // link rank -> next() already recorded
  bool prev_fallback_noted_ = false;      // link prev() -> rank already recorded
  std::vector<char> scratch_[2];
  std::vector<int> ports_;
  std::vector<std::string> hosts_;
  std::mutex setup_mu_;
  std::mutex run_mu_;
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> queue_;
  std::thread worker_;
  bool stopping_ = false;
};

// Process-wide registry: one Member per (communicator, rank).
std::shared_ptr<Member> GetMember(const std::string& communicator, int rank, int size);

}  // namespace ring
}  // namespace epl

#endif  // EPL_CSRC_OPS_RING_TRANSPORT_H_
