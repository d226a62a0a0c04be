// Process-wide NCCL communicators for EPL's GPU collective kernels.
//
// A communicator is identified by (key, rank): `key` is the op's `communicator`
// attribute (the same on every member of one group) and `rank` its NCCL rank.
// Several ranks of one group may live in one process (one per local GPU); each
// gets its own entry, CUDA stream and worker thread, so their blocking
// ncclCommInitRank calls can wait for one another without deadlocking.
#ifndef EPL_CSRC_NCCL_NCCL_COMM_H_
#define EPL_CSRC_NCCL_NCCL_COMM_H_

#if GOOGLE_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "tensorflow/core/lib/core/status.h"

namespace epl {
namespace nccl {

// Non-OK status naming what failed, with NCCL's / CUDA's own message.
tensorflow::Status NcclStatus(ncclResult_t result, const std::string& what);
tensorflow::Status CudaStatus(cudaError_t result, const std::string& what);

#define EPL_NCCL_RETURN_IF_ERROR(call) \
  TF_RETURN_IF_ERROR(::epl::nccl::NcclStatus((call), #call))
#define EPL_CUDA_RETURN_IF_ERROR(call) \
  TF_RETURN_IF_ERROR(::epl::nccl::CudaStatus((call), #call))

// One NCCL communicator (one rank of one group) on one GPU.
//
// All NCCL and CUDA calls for it run on its single worker thread, in the order
// the kernels scheduled them: NCCL needs every rank to issue the collectives of
// a communicator in the same order, and the graph chains them per member.
// Entries live until the process exits (never deleted: no CUDA teardown races
// at exit); after an NCCL error an entry is aborted and replaced.
class Comm {
 public:
  Comm(const std::string& key, int rank, int size, int gpu);
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // Runs `work` on the worker thread, after the work scheduled before it.
  void Schedule(std::function<void()> work);

  // Worker thread only: creates the stream and the NCCL communicator on first
  // use (ncclCommInitRank blocks until every rank joined); a no-op afterwards.
  tensorflow::Status Init(const ncclUniqueId& id);

  // Worker thread only: waits until the work queued on stream() so far is done,
  // polling NCCL's asynchronous error so a failed peer becomes an error, not a
  // silent hang. On error the communicator is aborted and dropped from the cache.
  tensorflow::Status Sync();

  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int gpu() const { return gpu_; }
  // "communicator 'key' rank r of n on GPU g", for error messages.
  const std::string& description() const { return description_; }

 private:
  void Loop();
  tensorflow::Status Fail(const tensorflow::Status& status);

  const std::string key_;
  const int rank_, size_, gpu_;
  const std::string description_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t synced_ = nullptr;
  bool broken_ = false;  // aborted after an error; replaced in the cache
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  std::thread worker_;
};

// The cached communicator for (key, rank), created (not yet initialized) on
// first use. Fails if the cached one was made for another size or GPU, which
// means two different groups share a communicator key.
tensorflow::Status GetComm(const std::string& key, int rank, int size, int gpu, Comm** comm);

// Forgets a broken communicator so the next step builds a fresh one.
void DropComm(const Comm* comm, const std::string& key, int rank);

// The unique id of `key` in this process: made by ncclGetUniqueId once, then
// returned again (each ncclGetUniqueId starts a bootstrap listener, so making
// one per step would leak). Forgotten with the communicator after an error.
tensorflow::Status UniqueIdFor(const std::string& key, ncclUniqueId* id);
void ForgetUniqueId(const std::string& key);

}  // namespace nccl
}  // namespace epl

#endif  // GOOGLE_CUDA
#endif  // EPL_CSRC_NCCL_NCCL_COMM_H_
