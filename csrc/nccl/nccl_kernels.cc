// GPU kernels of EPL's NCCL collectives (GPU builds only, GOOGLE_CUDA).
//
// The op definitions live in csrc/ops/nccl_op_defs.cc (libepl_ops.so, loaded
// first); this library only registers kernels. Each kernel call:
//   1. on TF's thread: validates, allocates its output, records a `ready` event
//      on TF's compute stream (the producers of its inputs are enqueued there);
//   2. on its communicator's worker thread (nccl_comm.h): creates the NCCL
//      communicator on first use, makes the communicator's private stream wait
//      for `ready`, enqueues the collective, and waits for it while polling
//      NCCL's asynchronous errors; then calls `done`. Consumers are enqueued
//      on TF's compute stream only after `done`, so they see the finished result,
//      and the tensors are held until then, so their memory cannot be reused
//      while NCCL still reads or writes it.
// int32 tensors sit in host memory on TF's GPU devices; they are staged through
// device buffers on the private stream.
#if GOOGLE_CUDA

#include <cstring>
#include <memory>
#include <string>

#include "nccl_comm.h"
#include "tensorflow/core/framework/device_base.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/lib/strings/strcat.h"
#include "tensorflow/stream_executor/stream.h"
#include "tensorflow/stream_executor/stream_executor_internal.h"

namespace epl {
namespace nccl {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::DEVICE_CPU;
using tensorflow::DEVICE_GPU;
using tensorflow::HOST_MEMORY;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::PartialTensorShape;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::int64;
namespace errors = tensorflow::errors;

constexpr int kUniqueIdWords = 16;
static_assert(sizeof(ncclUniqueId) == kUniqueIdWords * sizeof(int64),
              "ncclUniqueId must travel as int64[16]");

namespace {

Status NcclType(DataType dtype, ncclDataType_t* type) {
  switch (dtype) {
    case tensorflow::DT_HALF: *type = ncclHalf; return Status();
    case tensorflow::DT_FLOAT: *type = ncclFloat; return Status();
    case tensorflow::DT_DOUBLE: *type = ncclDouble; return Status();
    case tensorflow::DT_INT32: *type = ncclInt32; return Status();
    case tensorflow::DT_INT64: *type = ncclInt64; return Status();
    default:
      return errors::InvalidArgument("NCCL has no type for ", DataTypeString(dtype));
  }
}

// Makes `gpu` the calling (TF) thread's CUDA device for one scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int gpu) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    cudaSetDevice(gpu);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

// The CUDA ordinal and compute stream of the op's GPU device.
Status ComputeStream(OpKernelContext* ctx, int* gpu, cudaStream_t* stream) {
  const auto* info = ctx->device()->tensorflow_gpu_device_info();
  auto* context = ctx->op_device_context();
  if (info == nullptr || context == nullptr || context->stream() == nullptr) {
    return errors::FailedPrecondition("EPL NCCL ops run on GPU devices only");
  }
  void** member = context->stream()->implementation()->GpuStreamMemberHack();
  if (member == nullptr) return errors::Internal("no CUDA stream behind TF's GPU stream");
  *gpu = info->gpu_id;
  *stream = *reinterpret_cast<cudaStream_t*>(member);
  return Status();
}

Status ReadUniqueId(OpKernelContext* ctx, ncclUniqueId* id) {
  const Tensor* words = nullptr;
  TF_RETURN_IF_ERROR(ctx->input("unique_id", &words));
  if (words->dtype() != tensorflow::DT_INT64 || words->NumElements() != kUniqueIdWords) {
    return errors::InvalidArgument("unique_id must be int64[16], got ",
                                   words->shape().DebugString());
  }
  std::memcpy(id, words->tensor_data().data(), sizeof(*id));
  return Status();
}

}  // namespace

// What one kernel call hands to the worker thread. Tensors are held by value
// (reference-counted buffers): they stay alive until the collective finished.
struct Call {
  Tensor input, output;          // no input for EplNcclBroadcastRecv
  Tensor device_in, device_out;  // device copies of host-memory (int32) data
  Tensor scratch;                // int64[4] for a broadcast's root discovery
  bool has_input = false;
  ncclDataType_t type = ncclFloat;
  int64 count = 0;  // elements of the input (of the output for a receive)
  ncclUniqueId id;
  cudaStream_t compute = nullptr;
  cudaEvent_t ready = nullptr;

  const void* in() const { return Data(device_in.IsInitialized() ? device_in : input); }
  void* out() const {
    return const_cast<void*>(Data(device_out.IsInitialized() ? device_out : output));
  }
  static const void* Data(const Tensor& t) {
    return t.IsInitialized() ? t.tensor_data().data() : nullptr;
  }
};

// Base of the collective kernels: attributes, threading, staging, errors.
class NcclKernel : public AsyncOpKernel {
 public:
  explicit NcclKernel(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rank", &rank_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("size", &size_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("communicator", &key_));
    OP_REQUIRES(ctx, rank_ < size_,
                errors::InvalidArgument("rank ", rank_, " is not below size ", size_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) final {
    auto call = std::make_shared<Call>();
    Comm* comm = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, Annotate(Start(ctx, call.get(), &comm)), done);
    comm->Schedule([this, ctx, comm, call, done]() {
      Status status = Run(comm, call.get());
      if (!status.ok()) ctx->SetStatus(Annotate(status));
      done();
    });
  }

 protected:
  // TF thread: checks shapes, allocates the output (via AllocateOutput) and
  // sets call->count.
  virtual Status Prepare(OpKernelContext* ctx, Call* call) = 0;
  // Worker thread: enqueues the collective on comm->stream().
  virtual Status Launch(Comm* comm, Call* call) = 0;

  Status AllocateOutput(OpKernelContext* ctx, const TensorShape& shape, Call* call) {
    Tensor* out = nullptr;
    if (call->has_input) {  // in place when TF lets us reuse the input buffer
      TF_RETURN_IF_ERROR(ctx->forward_input_or_allocate_output({0}, 0, shape, &out));
    } else {
      TF_RETURN_IF_ERROR(ctx->allocate_output(0, shape, &out));
    }
    call->output = *out;
    return Status();
  }

  Status CheckRows(const Tensor& input) const {
    if (input.dims() < 1 || input.dim_size(0) % size_ != 0) {
      return errors::InvalidArgument("dim 0 of ", input.shape().DebugString(),
                                     " must be divisible by the group size ", size_);
    }
    return Status();
  }

  int rank_ = 0;
  int size_ = 1;
  std::string key_;

 private:
  Status Start(OpKernelContext* ctx, Call* call, Comm** comm) {
    int gpu = -1;
    TF_RETURN_IF_ERROR(ComputeStream(ctx, &gpu, &call->compute));
    TF_RETURN_IF_ERROR(ReadUniqueId(ctx, &call->id));
    call->has_input = ctx->num_inputs() == 2;
    if (call->has_input) call->input = ctx->input(0);
    TF_RETURN_IF_ERROR(NcclType(output_type(0), &call->type));
    TF_RETURN_IF_ERROR(Prepare(ctx, call));
    TF_RETURN_IF_ERROR(AllocateStaging(ctx, call));
    TF_RETURN_IF_ERROR(GetComm(key_, rank_, size_, gpu, comm));
    DeviceGuard guard(gpu);
    EPL_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&call->ready, cudaEventDisableTiming));
    Status recorded = CudaStatus(cudaEventRecord(call->ready, call->compute), "cudaEventRecord");
    if (!recorded.ok()) cudaEventDestroy(call->ready);
    return recorded;
  }

  // Device buffers for data TF keeps in host memory (int32 on GPU devices).
  Status AllocateStaging(OpKernelContext* ctx, Call* call) {
    if (call->has_input && ctx->input_memory_type(0) == HOST_MEMORY) {
      TF_RETURN_IF_ERROR(
          ctx->allocate_temp(call->input.dtype(), call->input.shape(), &call->device_in));
    }
    if (ctx->output_memory_type(0) == HOST_MEMORY) {
      TF_RETURN_IF_ERROR(
          ctx->allocate_temp(call->output.dtype(), call->output.shape(), &call->device_out));
    }
    return Status();
  }

  Status Run(Comm* comm, Call* call) {
    Status status = comm->Init(call->id);
    if (status.ok()) {
      status = CudaStatus(cudaStreamWaitEvent(comm->stream(), call->ready, 0),
                          "cudaStreamWaitEvent");
    }
    cudaEventDestroy(call->ready);  // released by CUDA once the stream passed it
    TF_RETURN_IF_ERROR(status);
    status = Copy(call->device_in, call->input, cudaMemcpyHostToDevice, comm);
    if (status.ok()) status = Launch(comm, call);
    if (status.ok()) status = Copy(call->output, call->device_out, cudaMemcpyDeviceToHost, comm);
    // Wait even after a failed launch: queued work may still use the call's tensors.
    Status synced = comm->Sync();
    return status.ok() ? synced : status;
  }

  // Staging copy on the private stream; a no-op when nothing was staged.
  static Status Copy(const Tensor& to, const Tensor& from, cudaMemcpyKind kind, Comm* comm) {
    const Tensor& staged = kind == cudaMemcpyHostToDevice ? to : from;
    if (!staged.IsInitialized() || staged.NumElements() == 0) return Status();
    return CudaStatus(cudaMemcpyAsync(const_cast<char*>(to.tensor_data().data()),
                                      from.tensor_data().data(), from.TotalBytes(), kind,
                                      comm->stream()),
                      "cudaMemcpyAsync (int32 staging)");
  }

  Status Annotate(const Status& status) const {
    if (status.ok()) return status;
    return Status(status.code(), tensorflow::strings::StrCat(
                                     type_string(), " '", name(), "' (communicator '", key_,
                                     "', rank ", rank_, " of ", size_, "): ",
                                     status.error_message()));
  }
};

// Sum or mean reductions: "mean" is ncclAvg (NCCL >= 2.10).
Status ReductionOp(OpKernelConstruction* ctx, ncclRedOp_t* op) {
  std::string reduction;
  TF_RETURN_IF_ERROR(ctx->GetAttr("reduction", &reduction));
  *op = ncclSum;
  if (reduction == "sum") return Status();
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
  *op = ncclAvg;
  return Status();
#else
  return errors::Unimplemented("reduction='mean' needs NCCL >= 2.10 (ncclAvg); this build "
                               "has ", NCCL_VERSION_CODE, ": use 'sum' and divide");
#endif
}

class AllReduceOp : public NcclKernel {
 public:
  explicit AllReduceOp(OpKernelConstruction* ctx) : NcclKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReductionOp(ctx, &op_));
  }

 protected:
  Status Prepare(OpKernelContext* ctx, Call* call) override {
    call->count = call->input.NumElements();
    return AllocateOutput(ctx, call->input.shape(), call);
  }
  Status Launch(Comm* comm, Call* call) override {
    return NcclStatus(ncclAllReduce(call->in(), call->out(), call->count, call->type, op_,
                                    comm->comm(), comm->stream()),
                      "ncclAllReduce");
  }

 private:
  ncclRedOp_t op_ = ncclSum;
};

class AllGatherOp : public NcclKernel {
 public:
  using NcclKernel::NcclKernel;

 protected:
  Status Prepare(OpKernelContext* ctx, Call* call) override {
    if (call->input.dims() < 1) return errors::InvalidArgument("all-gather needs rank >= 1");
    TensorShape shape = call->input.shape();
    shape.set_dim(0, shape.dim_size(0) * size_);
    call->count = call->input.NumElements();
    Tensor* out = nullptr;  // never in place: the output is larger
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, shape, &out));
    call->output = *out;
    return Status();
  }
  Status Launch(Comm* comm, Call* call) override {
    return NcclStatus(ncclAllGather(call->in(), call->out(), call->count, call->type,
                                    comm->comm(), comm->stream()),
                      "ncclAllGather");
  }
};

class ReduceScatterOp : public NcclKernel {
 public:
  explicit ReduceScatterOp(OpKernelConstruction* ctx) : NcclKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReductionOp(ctx, &op_));
  }

 protected:
  Status Prepare(OpKernelContext* ctx, Call* call) override {
    TF_RETURN_IF_ERROR(CheckRows(call->input));
    TensorShape shape = call->input.shape();
    shape.set_dim(0, shape.dim_size(0) / size_);
    call->count = call->input.NumElements() / size_;  // elements each member receives
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, shape, &out));
    call->output = *out;
    return Status();
  }
  Status Launch(Comm* comm, Call* call) override {
    return NcclStatus(ncclReduceScatter(call->in(), call->out(), call->count, call->type, op_,
                                        comm->comm(), comm->stream()),
                      "ncclReduceScatter");
  }

 private:
  ncclRedOp_t op_ = ncclSum;
};

class AllToAllOp : public NcclKernel {
 public:
  using NcclKernel::NcclKernel;

 protected:
  Status Prepare(OpKernelContext* ctx, Call* call) override {
    TF_RETURN_IF_ERROR(CheckRows(call->input));
    call->count = call->input.NumElements();
    Tensor* out = nullptr;  // never in place: every chunk is read and written
    TF_RETURN_IF_ERROR(ctx->allocate_output(0, call->input.shape(), &out));
    call->output = *out;
    return Status();
  }
  Status Launch(Comm* comm, Call* call) override {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 7, 0)
    const size_t chunk = call->count / size_;
    const size_t bytes = chunk * DataTypeSize(output_type(0));
    const char* in = static_cast<const char*>(call->in());
    char* out = static_cast<char*>(call->out());
    Status status = NcclStatus(ncclGroupStart(), "ncclGroupStart");
    for (int peer = 0; status.ok() && peer < size_; ++peer) {
      status = NcclStatus(ncclSend(in + peer * bytes, chunk, call->type, peer, comm->comm(),
                                   comm->stream()), "ncclSend");
      if (status.ok()) {
        status = NcclStatus(ncclRecv(out + peer * bytes, chunk, call->type, peer, comm->comm(),
                                     comm->stream()), "ncclRecv");
      }
    }
    Status ended = NcclStatus(ncclGroupEnd(), "ncclGroupEnd");  // always close the group
    return status.ok() ? ended : status;
#else
    return errors::Unimplemented("all-to-all needs NCCL >= 2.7 (ncclSend/ncclRecv)");
#endif
  }
};

// Both broadcast kernels: the sender (EplNcclBroadcast) and the receivers
// (EplNcclBroadcastRecv). Receivers do not know the root, so every member first
// all-reduces [senders, root] (sum) and [count, -count] (max): all members then
// know the root, and all of them see the same misuse (no or several senders,
// different sizes) and fail together instead of hanging in ncclBroadcast.
class BroadcastOp : public NcclKernel {
 public:
  explicit BroadcastOp(OpKernelConstruction* ctx) : NcclKernel(ctx) {
    if (HasAttr(ctx, "shape")) {
      PartialTensorShape partial;
      OP_REQUIRES_OK(ctx, ctx->GetAttr("shape", &partial));
      OP_REQUIRES(ctx, partial.AsTensorShape(&shape_),
                  errors::InvalidArgument("EplNcclBroadcastRecv needs a fully defined shape, "
                                          "got ", partial.DebugString()));
    }
  }

 protected:
  Status Prepare(OpKernelContext* ctx, Call* call) override {
    TensorShape shape = call->has_input ? call->input.shape() : shape_;
    call->count = shape.num_elements();
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT64, TensorShape({4}),
                                          &call->scratch));
    return AllocateOutput(ctx, shape, call);
  }

  Status Launch(Comm* comm, Call* call) override {
    int root = -1;
    TF_RETURN_IF_ERROR(FindRoot(comm, call, &root));
    return NcclStatus(ncclBroadcast(call->in(), call->out(), call->count, call->type, root,
                                    comm->comm(), comm->stream()),
                      "ncclBroadcast");
  }

 private:
  static bool HasAttr(OpKernelConstruction* ctx, const char* name) {
    return ctx->def().attr().count(name) > 0;
  }

  Status FindRoot(Comm* comm, Call* call, int* root) {
    const int64 sender = call->has_input ? 1 : 0;
    int64 host[4] = {sender, sender * rank_, call->count, -call->count};
    int64* dev = reinterpret_cast<int64*>(const_cast<char*>(call->scratch.tensor_data().data()));
    EPL_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dev, host, sizeof(host), cudaMemcpyHostToDevice, comm->stream()));
    EPL_NCCL_RETURN_IF_ERROR(
        ncclAllReduce(dev, dev, 2, ncclInt64, ncclSum, comm->comm(), comm->stream()));
    EPL_NCCL_RETURN_IF_ERROR(
        ncclAllReduce(dev + 2, dev + 2, 2, ncclInt64, ncclMax, comm->comm(), comm->stream()));
    EPL_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, dev, sizeof(host), cudaMemcpyDeviceToHost, comm->stream()));
    TF_RETURN_IF_ERROR(comm->Sync());  // `host` must be filled before it is read
    if (host[0] != 1) {
      return errors::InvalidArgument("broadcast has ", host[0], " senders; exactly one member "
                                     "must call broadcast_send");
    }
    if (host[2] != -host[3]) {
      return errors::InvalidArgument("broadcast members disagree on the element count (",
                                     -host[3], " to ", host[2], ")");
    }
    *root = static_cast<int>(host[1]);
    return Status();
  }

  TensorShape shape_;
};

// EplNcclUniqueId: one id per communicator key per process (see UniqueIdFor).
class UniqueIdOp : public OpKernel {
 public:
  explicit UniqueIdOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("communicator", &key_));
  }

  void Compute(OpKernelContext* ctx) override {
    ncclUniqueId id;
    OP_REQUIRES_OK(ctx, UniqueIdFor(key_, &id));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({kUniqueIdWords}), &out));
    std::memcpy(const_cast<char*>(out->tensor_data().data()), &id, sizeof(id));
  }

 private:
  std::string key_;
};

REGISTER_KERNEL_BUILDER(Name("EplNcclUniqueId").Device(DEVICE_CPU), UniqueIdOp);
REGISTER_KERNEL_BUILDER(Name("EplNcclUniqueId").Device(DEVICE_GPU).HostMemory("unique_id"),
                        UniqueIdOp);

#define EPL_REGISTER_NCCL(op, kernel, type)                                              \
  REGISTER_KERNEL_BUILDER(                                                               \
      Name(op).Device(DEVICE_GPU).TypeConstraint<type>("T").HostMemory("unique_id"), \
      kernel)
#define EPL_REGISTER_NCCL_TYPE(type)                                 \
  EPL_REGISTER_NCCL("EplNcclAllReduce", AllReduceOp, type);          \
  EPL_REGISTER_NCCL("EplNcclAllGather", AllGatherOp, type);          \
  EPL_REGISTER_NCCL("EplNcclBroadcast", BroadcastOp, type);          \
  EPL_REGISTER_NCCL("EplNcclBroadcastRecv", BroadcastOp, type);      \
  EPL_REGISTER_NCCL("EplNcclReduceScatter", ReduceScatterOp, type);  \
  EPL_REGISTER_NCCL("EplNcclAllToAll", AllToAllOp, type);

EPL_REGISTER_NCCL_TYPE(Eigen::half);
EPL_REGISTER_NCCL_TYPE(float);
EPL_REGISTER_NCCL_TYPE(double);
EPL_REGISTER_NCCL_TYPE(tensorflow::int32);
EPL_REGISTER_NCCL_TYPE(tensorflow::int64);
#undef EPL_REGISTER_NCCL_TYPE
#undef EPL_REGISTER_NCCL

}  // namespace nccl
}  // namespace epl

#endif  // GOOGLE_CUDA
