// EPL NCCL collective op definitions (no kernels).
//
// These definitions are compiled into the CPU library libepl_ops.so on every
// machine, so graphs holding NCCL nodes can be built, inspected and exported
// anywhere. The GPU kernels live in libepl_nccl_ops.so (csrc/nccl/), built only
// where CUDA and NCCL headers exist; the loader loads it after this library.
//
// Every collective takes the group's NCCL unique id (int64[16], made by
// EplNcclUniqueId on the group's rank 0 and broadcast to the others) and is
// keyed by `communicator`: the first op of a (communicator, rank) pair in a
// process creates the NCCL communicator with ncclCommInitRank, later ops reuse
// it and ignore the id. All ops are stateful: they must never be constant-folded
// or merged by common-subexpression elimination, since every member has to issue
// the same collectives in the same order.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace epl {

using tensorflow::PartialTensorShape;
using tensorflow::Status;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

namespace {

constexpr int kUniqueIdWords = 16;  // NCCL_UNIQUE_ID_BYTES (128) / sizeof(int64)

// The unique_id input must be int64[16].
Status CheckUniqueId(InferenceContext* c, int index) {
  ShapeHandle id;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(index), 1, &id));
  DimensionHandle words;
  return c->WithValue(c->Dim(id, 0), kUniqueIdWords, &words);
}

Status GroupSize(InferenceContext* c, tensorflow::int64* size) {
  int value = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("size", &value));
  *size = value;
  return Status();
}

// Output shape = input shape (all-reduce, broadcast).
Status SameShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckUniqueId(c, 1));
  c->set_output(0, c->input(0));
  return Status();
}

// The checks shared by gather and split shapes: the unique id, the group size,
// and input 0 of rank >= 1 (its dim 0 is what the group multiplies or divides).
Status GroupedInput(InferenceContext* c, ShapeHandle* in, tensorflow::int64* size) {
  TF_RETURN_IF_ERROR(CheckUniqueId(c, 1));
  TF_RETURN_IF_ERROR(GroupSize(c, size));
  return c->WithRankAtLeast(c->input(0), 1, in);
}

// Dim 0 multiplied by the group size (all-gather).
Status GatherShape(InferenceContext* c) {
  tensorflow::int64 size = 0;
  ShapeHandle in, out;
  DimensionHandle rows;
  TF_RETURN_IF_ERROR(GroupedInput(c, &in, &size));
  TF_RETURN_IF_ERROR(c->Multiply(c->Dim(in, 0), size, &rows));
  TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, rows, &out));
  c->set_output(0, out);
  return Status();
}

// Dim 0 must split evenly over the group; `divide` says whether the output
// keeps one chunk (reduce-scatter) or all of them (all-to-all).
Status SplitShape(InferenceContext* c, bool divide) {
  tensorflow::int64 size = 0;
  ShapeHandle in, out;
  DimensionHandle chunk;
  TF_RETURN_IF_ERROR(GroupedInput(c, &in, &size));
  TF_RETURN_IF_ERROR(c->Divide(c->Dim(in, 0), size, /*evenly_divisible=*/true, &chunk));
  if (!divide) {
    c->set_output(0, in);
    return Status();
  }
  TF_RETURN_IF_ERROR(c->ReplaceDim(in, 0, chunk, &out));
  c->set_output(0, out);
  return Status();
}

}  // namespace

// Attributes every collective carries. `communicator` names the NCCL
// communicator (the same string on every member of one group, different for
// different groups); `rank` is this member's position in the group's device
// order, which is also its NCCL rank, so gathers come back in group order.
#define EPL_NCCL_COMMON_ATTRS                      \
  Attr("T: {half, float, double, int32, int64}")   \
      .Attr("rank: int >= 0")                      \
      .Attr("size: int >= 1")                      \
      .Attr("communicator: string")

REGISTER_OP("EplNcclUniqueId")
    .Output("unique_id: int64")
    .Attr("communicator: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(kUniqueIdWords));
      return Status();
    })
    .Doc(R"doc(
An ncclUniqueId (128 bytes as int64[16], host memory) for `communicator`.

Made once per communicator per process and returned again on later runs, so
running it every step neither leaks NCCL bootstrap sockets nor changes the id.
Run it on the group's rank 0 and broadcast the result to the other members.
)doc");

REGISTER_OP("EplNcclAllReduce")
    .Input("input: T")
    .Input("unique_id: int64")
    .Output("output: T")
    .EPL_NCCL_COMMON_ATTRS
    .Attr("reduction: {'sum', 'mean'} = 'sum'")
    .SetIsStateful()
    .SetShapeFn(SameShape)
    .Doc(R"doc(
Sum (or mean, with NCCL >= 2.10) of `input` over the `size` members.

unique_id: int64[16] from EplNcclUniqueId (rank 0) or its broadcast.
)doc");

REGISTER_OP("EplNcclAllGather")
    .Input("input: T")
    .Input("unique_id: int64")
    .Output("output: T")
    .EPL_NCCL_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(GatherShape)
    .Doc(R"doc(
Every member's `input` concatenated along dim 0 in rank order.

All members must pass the same shape; the output has `size` times the rows.
)doc");

REGISTER_OP("EplNcclBroadcast")
    .Input("input: T")
    .Input("unique_id: int64")
    .Output("output: T")
    .EPL_NCCL_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn(SameShape)
    .Doc(R"doc(
Sends `input` from this member (the root) to every EplNcclBroadcastRecv of the
group; `output` is a copy of `input`.

Receivers do not know the root, so the kernel first finds it with a one-element
all-reduce (which also rejects zero or several senders), then runs ncclBroadcast.
)doc");

REGISTER_OP("EplNcclBroadcastRecv")
    .Input("unique_id: int64")
    .Output("output: T")
    .EPL_NCCL_COMMON_ATTRS
    .Attr("shape: shape")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(CheckUniqueId(c, 0));
      PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(0, out);
      return Status();
    })
    .Doc(R"doc(
Receives the tensor that the group's EplNcclBroadcast member sends.

shape: the sent tensor's shape (fully defined at run time).
)doc");

REGISTER_OP("EplNcclReduceScatter")
    .Input("input: T")
    .Input("unique_id: int64")
    .Output("output: T")
    .EPL_NCCL_COMMON_ATTRS
    .Attr("reduction: {'sum', 'mean'} = 'sum'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return SplitShape(c, /*divide=*/true); })
    .Doc(R"doc(
Member `rank`'s slice (dim 0, split in `size` equal chunks) of the reduction.

Dim 0 of `input` must be divisible by `size`.
)doc");

REGISTER_OP("EplNcclAllToAll")
    .Input("input: T")
    .Input("unique_id: int64")
    .Output("output: T")
    .EPL_NCCL_COMMON_ATTRS
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return SplitShape(c, /*divide=*/false); })
    .Doc(R"doc(
Splits dim 0 of `input` in `size` chunks and sends chunk j to member j; the
output concatenates, in rank order, the chunk every member sent to this one.

Grouped ncclSend/ncclRecv: needs NCCL >= 2.7. Dim 0 must be divisible by `size`.
)doc");

#undef EPL_NCCL_COMMON_ATTRS

}  // namespace epl
