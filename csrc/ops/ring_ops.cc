// EPL ring collective ops (CPU): set up TCP rings and all-reduce over them.
//
//   EplRingListen   -> the port this member listens on (published with a TF all-gather)
//   EplRingConnect  <- every member's port; connects the ring (idempotent) and
//                      upgrades links to shared memory between members on one host
//   EplRingAllReduce   ring reduce-scatter + all-gather, accumulating float16 in float
//
// The all-reduce is an AsyncOpKernel whose work runs on its own thread, so a
// member waiting for its peers never holds one of TF's inter-op threads, and a
// peer that stops responding becomes a DeadlineExceeded error after
// `timeout_seconds` instead of a hang.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "half_convert.h"
#include "ring_transport.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/logging.h"

namespace epl {
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::DEVICE_CPU;
using tensorflow::int64;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::InferenceContext;

Status ToStatus(const ring::Result& result, const std::string& what) {
  if (result.ok()) return Status();
  return tensorflow::errors::DeadlineExceeded("EPL ring ", what, ": ", result.error);
}

struct RingAttrs {
  std::string communicator;
  int rank = 0;
  int size = 1;
  float timeout = 600;

  Status Read(OpKernelConstruction* ctx) {
    TF_RETURN_IF_ERROR(ctx->GetAttr("communicator", &communicator));
    TF_RETURN_IF_ERROR(ctx->GetAttr("rank", &rank));
    TF_RETURN_IF_ERROR(ctx->GetAttr("size", &size));
    if (size < 1 || rank < 0 || rank >= size)
      return tensorflow::errors::InvalidArgument("bad ring rank ", rank, " of size ", size);
    return ctx->GetAttr("timeout_seconds", &timeout);
  }
  std::string Where() const {
    return communicator + " rank " + std::to_string(rank) + "/" + std::to_string(size);
  }
};

REGISTER_OP("EplRingListen")
    .Output("port: int32")
    .Attr("communicator: string")
    .Attr("rank: int")
    .Attr("size: int")
    .Attr("timeout_seconds: float = 600")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return Status();
    });

REGISTER_OP("EplRingConnect")
    .Input("ports: int32")
    .Output("ready: int32")
    .Attr("communicator: string")
    .Attr("rank: int")
    .Attr("size: int")
    .Attr("hosts: list(string)")
    .Attr("timeout_seconds: float = 600")
    .Attr("shared_memory: bool = true")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return Status();
    })
    .Doc("ready: 1 when connected, plus 2 if the link to the successor and 4 if the link "
         "from the predecessor use shared memory.");

REGISTER_OP("EplRingAllReduce")
    .Input("input: T")
    .Output("output: T")
    .Attr("T: {half, float, double, int32, int64}")
    .Attr("communicator: string")
    .Attr("rank: int")
    .Attr("size: int")
    .Attr("instance_key: int")
    .Attr("mean: bool = true")
    .Attr("wire_float16: bool = false")
    .Attr("scale: float = 1.0")
    .Attr("timeout_seconds: float = 600")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return Status();
    })
    .Doc("Ring all-reduce over TCP. With wire_float16 (float32 input only) chunks travel "
         "as float16 of value*scale and are accumulated in float32.");

class ListenOp : public OpKernel {
 public:
  explicit ListenOp(OpKernelConstruction* ctx) : OpKernel(ctx) { OP_REQUIRES_OK(ctx, attrs_.Read(ctx)); }
  void Compute(OpKernelContext* ctx) override {
    auto member = ring::GetMember(attrs_.communicator, attrs_.rank, attrs_.size);
    int port = 0;
    OP_REQUIRES_OK(ctx, ToStatus(member->Listen(&port), "listen on " + attrs_.Where()));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int>()() = port;
  }

 private:
  RingAttrs attrs_;
};

// A same-host link left on TCP makes every step of the job slower than it
// should be, so say why (a full /dev/shm, a limit on file sizes), once per link
// (the member hands each one out once). Between hosts TCP is the normal
// transport, and the failure to map the peer's segment is only informational.
void ReportFallbacks(const std::string& communicator, ring::Member* member) {
  for (const ring::LinkFallback& link : member->TakeFallbacks()) {
    if (link.same_host) {
      LOG(WARNING) << "EPL ring " << communicator << ": link " << link.link
                   << " uses TCP instead of shared memory: " << link.reason;
    } else {
      LOG(INFO) << "EPL ring " << communicator << ": link " << link.link
                << " uses TCP (the members are on different hosts): " << link.reason;
    }
  }
}

// Async: two members of one process must connect to each other at the same
// time, so connecting may never occupy (or run inline on) a TF executor thread.
class ConnectOp : public AsyncOpKernel {
 public:
  explicit ConnectOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hosts", &hosts_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shared_memory", &shared_memory_));
    OP_REQUIRES(ctx, static_cast<int>(hosts_.size()) == attrs_.size,
                tensorflow::errors::InvalidArgument("EplRingConnect needs one host per member"));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& ports_tensor = ctx->input(0);
    OP_REQUIRES_ASYNC(ctx, ports_tensor.NumElements() == attrs_.size,
                      tensorflow::errors::InvalidArgument(
                          "EplRingConnect got ", ports_tensor.NumElements(), " ports for ",
                          attrs_.size, " members"),
                      done);
    auto flat = ports_tensor.flat<int>();
    std::vector<int> ports(flat.data(), flat.data() + flat.size());
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    auto member = ring::GetMember(attrs_.communicator, attrs_.rank, attrs_.size);
    std::thread([this, ctx, member, ports, out, done]() {
      ctx->SetStatus(ToStatus(member->Connect(ports, hosts_, attrs_.timeout, shared_memory_),
                              "connect " + attrs_.Where()));
      ReportFallbacks(attrs_.communicator, member.get());
      out->scalar<int>()() = member->LinkState();
      done();
    }).detach();
  }

 private:
  RingAttrs attrs_;
  std::vector<std::string> hosts_;
  bool shared_memory_ = true;
};

template <typename T>
struct Arith {
  static void Add(T* dst, const T* src, int64 n) {
    for (int64 i = 0; i < n; ++i) dst[i] += src[i];
  }
  static void Divide(T* data, int64 n, int by) {
    for (int64 i = 0; i < n; ++i) data[i] /= static_cast<T>(by);
  }
};

template <>
struct Arith<Eigen::half> {  // accumulate in float, store half
  static void Add(Eigen::half* dst, const Eigen::half* src, int64 n) {
    for (int64 i = 0; i < n; ++i)
      dst[i] = Eigen::half(static_cast<float>(dst[i]) + static_cast<float>(src[i]));
  }
  static void Divide(Eigen::half* data, int64 n, int by) {
    for (int64 i = 0; i < n; ++i) data[i] = Eigen::half(static_cast<float>(data[i]) / by);
  }
};

// Ring all-reduce of `data` (n elements) in place: N-1 reduce-scatter steps,
// then N-1 all-gather steps; member r ends the first phase owning chunk r+1.
template <typename T>
ring::Result RingAllReduce(ring::Member* member, uint64_t instance, T* data, int64 n, bool mean,
                           double timeout) {
  const int size = member->size(), rank = member->rank();
  std::vector<int64> count(size, n / size), offset(size, 0);
  for (int i = 0; i < n % size; ++i) ++count[i];
  for (int i = 1; i < size; ++i) offset[i] = offset[i - 1] + count[i - 1];
  T* incoming = reinterpret_cast<T*>(member->Scratch(0, count[0] * sizeof(T)));
  auto chunk = [&](int i) { return ((i % size) + size) % size; };
  uint64_t step = 0;
  for (int s = 0; s < size - 1; ++s, ++step) {
    int out = chunk(rank - s), in = chunk(rank - s - 1);
    ring::Result r = member->Exchange(
        instance, step, reinterpret_cast<const char*>(data + offset[out]), count[out] * sizeof(T),
        reinterpret_cast<char*>(incoming), count[in] * sizeof(T), timeout);
    if (!r.ok()) return r;
    Arith<T>::Add(data + offset[in], incoming, count[in]);
  }
  int owned = chunk(rank + 1);
  if (mean) Arith<T>::Divide(data + offset[owned], count[owned], size);
  for (int s = 0; s < size - 1; ++s, ++step) {
    int out = chunk(rank - s + 1), in = chunk(rank - s);
    ring::Result r = member->Exchange(
        instance, step, reinterpret_cast<const char*>(data + offset[out]), count[out] * sizeof(T),
        reinterpret_cast<char*>(data + offset[in]), count[in] * sizeof(T), timeout);
    if (!r.ok()) return r;
  }
  return ring::Result::Ok();
}

// Ring all-reduce of float32 data whose chunks travel as float16 (value*scale).
// Partial sums accumulate in float32; after the reduce-scatter each owner rounds
// its chunk through float16 once, and the all-gather forwards those exact bits,
// so every member ends with identical values.
ring::Result RingAllReduceHalfWire(ring::Member* member, uint64_t instance, float* data,
                                   int64 n, bool mean, float scale, double timeout) {
  const int size = member->size(), rank = member->rank();
  std::vector<int64> count(size, n / size), offset(size, 0);
  for (int i = 0; i < n % size; ++i) ++count[i];
  for (int i = 1; i < size; ++i) offset[i] = offset[i - 1] + count[i - 1];
  uint16_t* out_half = reinterpret_cast<uint16_t*>(member->Scratch(0, count[0] * 2));
  uint16_t* in_half = reinterpret_cast<uint16_t*>(member->Scratch(1, count[0] * 2));
  auto chunk = [&](int i) { return ((i % size) + size) % size; };
  const float inverse = 1.0f / scale;
  uint64_t step = 0;
  for (int s = 0; s < size - 1; ++s, ++step) {
    int out = chunk(rank - s), in = chunk(rank - s - 1);
    half_convert::ToHalf(data + offset[out], out_half, count[out], scale);
    ring::Result r = member->Exchange(
        instance, step, reinterpret_cast<const char*>(out_half), count[out] * 2,
        reinterpret_cast<char*>(in_half), count[in] * 2, timeout);
    if (!r.ok()) return r;
    half_convert::AddFromHalf(in_half, data + offset[in], count[in], inverse);
  }
  int owned = chunk(rank + 1);
  const float owned_scale = mean ? scale / size : scale;
  half_convert::ToHalf(data + offset[owned], out_half, count[owned], owned_scale);
  half_convert::FromHalf(out_half, data + offset[owned], count[owned], inverse);
  for (int s = 0; s < size - 1; ++s, ++step) {
    int out = chunk(rank - s + 1), in = chunk(rank - s);
    ring::Result r = member->Exchange(
        instance, step, reinterpret_cast<const char*>(out_half), count[out] * 2,
        reinterpret_cast<char*>(in_half), count[in] * 2, timeout);
    if (!r.ok()) return r;
    half_convert::FromHalf(in_half, data + offset[in], count[in], inverse);
    std::swap(out_half, in_half);  // forward the received bits unchanged next step
  }
  return ring::Result::Ok();
}

template <typename T>
class AllReduceOp : public AsyncOpKernel {
 public:
  explicit AllReduceOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, attrs_.Read(ctx));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("instance_key", &instance_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("mean", &mean_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("wire_float16", &wire_half_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scale", &scale_));
    OP_REQUIRES(ctx, (!wire_half_ || std::is_same<T, float>::value),
                tensorflow::errors::InvalidArgument("wire_float16 needs a float32 input"));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& input = ctx->input(0);
    Tensor* output = nullptr;
    // Reuse the input buffer when nothing else holds it (no copy).
    OP_REQUIRES_OK_ASYNC(ctx, ctx->forward_input_or_allocate_output({0}, 0, input.shape(),
                                                                    &output),
                         done);
    if (output->tensor_data().data() != input.tensor_data().data() && input.NumElements() > 0) {
      std::memcpy(const_cast<char*>(output->tensor_data().data()), input.tensor_data().data(),
                  input.TotalBytes());
    }
    if (attrs_.size == 1) {
      done();
      return;
    }
    auto member = ring::GetMember(attrs_.communicator, attrs_.rank, attrs_.size);
    member->Submit([this, ctx, output, member, done]() {
      T* data = reinterpret_cast<T*>(const_cast<char*>(output->tensor_data().data()));
      ring::Result r = Run(member.get(), data, output->NumElements());
      ctx->SetStatus(ToStatus(r, "all-reduce on " + attrs_.Where()));
      done();
    });
  }

 private:
  ring::Result Run(ring::Member* member, T* data, int64 n);

  RingAttrs attrs_;
  int64 instance_ = 0;
  bool mean_ = true;
  bool wire_half_ = false;
  float scale_ = 1.0f;
};

template <typename T>
ring::Result AllReduceOp<T>::Run(ring::Member* member, T* data, int64 n) {
  return RingAllReduce<T>(member, static_cast<uint64_t>(instance_), data, n, mean_,
                          attrs_.timeout);
}

template <>
ring::Result AllReduceOp<float>::Run(ring::Member* member, float* data, int64 n) {
  if (!wire_half_) {
    return RingAllReduce<float>(member, static_cast<uint64_t>(instance_), data, n, mean_,
                                attrs_.timeout);
  }
  return RingAllReduceHalfWire(member, static_cast<uint64_t>(instance_), data, n, mean_,
                               scale_, attrs_.timeout);
}

REGISTER_KERNEL_BUILDER(Name("EplRingListen").Device(DEVICE_CPU), ListenOp);
REGISTER_KERNEL_BUILDER(Name("EplRingConnect").Device(DEVICE_CPU), ConnectOp);
#define EPL_REGISTER_RING(type)                                                         \
  REGISTER_KERNEL_BUILDER(                                                              \
      Name("EplRingAllReduce").Device(DEVICE_CPU).TypeConstraint<type>("T"),            \
      AllReduceOp<type>);
EPL_REGISTER_RING(Eigen::half);
EPL_REGISTER_RING(float);
EPL_REGISTER_RING(double);
EPL_REGISTER_RING(tensorflow::int32);
EPL_REGISTER_RING(int64);
#undef EPL_REGISTER_RING

}  // namespace
}  // namespace epl
