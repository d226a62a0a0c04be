// Process-wide NCCL communicator cache and per-communicator worker threads.
// See nccl_comm.h for the design; GPU builds only.
#if GOOGLE_CUDA

#include "nccl_comm.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/lib/strings/strcat.h"

namespace epl {
namespace nccl {

using tensorflow::Status;

Status NcclStatus(ncclResult_t result, const std::string& what) {
  if (result == ncclSuccess) return Status();
  return tensorflow::errors::Internal(what, " failed: ", ncclGetErrorString(result));
}

Status CudaStatus(cudaError_t result, const std::string& what) {
  if (result == cudaSuccess) return Status();
  return tensorflow::errors::Internal(what, " failed: ", cudaGetErrorString(result));
}

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::pair<std::string, int>, Comm*> comms;  // leaked on purpose, see Comm
  std::map<std::string, ncclUniqueId> ids;
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: no exit-time teardown
  return *instance;
}

}  // namespace

Comm::Comm(const std::string& key, int rank, int size, int gpu)
    : key_(key),
      rank_(rank),
      size_(size),
      gpu_(gpu),
      description_(tensorflow::strings::StrCat("communicator '", key, "' rank ", rank, " of ",
                                               size, " on GPU ", gpu)),
      worker_([this] { Loop(); }) {
  worker_.detach();  // lives as long as the process, like the entry itself
}

void Comm::Schedule(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
  }
  wake_.notify_one();
}

void Comm::Loop() {
  cudaSetDevice(gpu_);  // every CUDA and NCCL call of this communicator runs here
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] { return !queue_.empty(); });
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

Status Comm::Init(const ncclUniqueId& id) {
  if (comm_ != nullptr) return Status();
  if (broken_) {
    return tensorflow::errors::Aborted(description_, " was aborted after an earlier NCCL error; "
                                       "the next step creates a fresh communicator");
  }
  if (stream_ == nullptr) {
    EPL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    EPL_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&synced_, cudaEventDisableTiming));
  }
  ncclComm_t comm = nullptr;
  Status status = NcclStatus(ncclCommInitRank(&comm, size_, id, rank_), "ncclCommInitRank");
  if (!status.ok()) return Fail(status);
  comm_ = comm;
  return Status();
}

Status Comm::Sync() {
  if (stream_ == nullptr) return Status();  // Init failed before anything was queued
  EPL_CUDA_RETURN_IF_ERROR(cudaEventRecord(synced_, stream_));
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    cudaError_t state = cudaEventQuery(synced_);
    if (state == cudaSuccess) return Status();
    if (state != cudaErrorNotReady) return Fail(CudaStatus(state, "waiting for NCCL"));
    if (comm_ != nullptr) {  // once aborted, its kernels are ending: just drain the stream
      ncclResult_t async = ncclSuccess;
      Status status = NcclStatus(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      if (status.ok()) status = NcclStatus(async, "NCCL (asynchronous error, a peer may be gone)");
      if (!status.ok()) return Fail(status);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

Status Comm::Fail(const Status& status) {
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  broken_ = true;
  DropComm(this, key_, rank_);
  ForgetUniqueId(key_);
  return status;  // the kernel adds the op, communicator and rank
}

Status GetComm(const std::string& key, int rank, int size, int gpu, Comm** comm) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  Comm*& entry = reg.comms[std::make_pair(key, rank)];
  if (entry == nullptr) entry = new Comm(key, rank, size, gpu);
  if (entry->size() != size || entry->gpu() != gpu) {
    return tensorflow::errors::InvalidArgument(
        entry->description(), " is now used with size ", size, " on GPU ", gpu,
        ": two groups share one communicator key");
  }
  *comm = entry;
  return Status();
}

void DropComm(const Comm* comm, const std::string& key, int rank) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.comms.find(std::make_pair(key, rank));
  if (it != reg.comms.end() && it->second == comm) reg.comms.erase(it);
}

Status UniqueIdFor(const std::string& key, ncclUniqueId* id) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.ids.find(key);
  if (it == reg.ids.end()) {
    ncclUniqueId fresh;
    EPL_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&fresh));
    it = reg.ids.emplace(key, fresh).first;
  }
  *id = it->second;
  return Status();
}

void ForgetUniqueId(const std::string& key) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.ids.erase(key);
}

}  // namespace nccl
}  // namespace epl

#endif  // GOOGLE_CUDA
