// EPL fused buffer ops (CPU): pack a list of tensors into one 1-D buffer and back.
//
// Gradient fusion all-reduces a few large buffers instead of many small tensors.
// The pure-TensorFlow path builds one Reshape per tensor plus a ConcatV2 (and a
// Split plus one Reshape per tensor to unpack); these ops do each direction in a
// single kernel. Pack makes one memcpy per tensor; unpack returns views into the
// buffer where they are suitably aligned (as TF's Split does) and copies the
// rest. Results are bit-identical.
//
// "Suitably aligned" means TensorFlow's alignment, not ours: TF's kernels check
// Tensor::IsAligned() against the EIGEN_MAX_ALIGN_BYTES of TF's own build (64),
// and abort the process on a misaligned input. A custom op compiled with the
// flags from tf.sysconfig sees a smaller EIGEN_MAX_ALIGN_BYTES (16 or 32), so
// testing against the macro handed out views that crashed the consumer (a
// model with 8-float biases). Views are therefore only made at offsets that are
// multiples of Allocator::kAllocatorAlignment, the alignment every TF buffer has.
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace epl {

// The alignment TF guarantees for every buffer it allocates, and the strictest
// alignment any of its kernels can check (see the file comment).
constexpr size_t kViewAlignment = tensorflow::Allocator::kAllocatorAlignment;
static_assert(EIGEN_MAX_ALIGN_BYTES <= kViewAlignment,
              "views aligned for TF's allocator must satisfy this build's Eigen too");

// True when a view starting at `address` may be handed to any TF kernel.
inline bool ViewAligned(const char* address) {
  return reinterpret_cast<uintptr_t>(address) % kViewAlignment == 0;
}

using tensorflow::DEVICE_CPU;
using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::OpOutputList;
using tensorflow::PartialTensorShape;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("EplPack")
    .Input("inputs: N * T")
    .Output("packed: T")
    .Attr("N: int >= 1")
    .Attr("T: type")
    .SetShapeFn([](InferenceContext* c) {
      tensorflow::int64 total = 0;
      for (int i = 0; i < c->num_inputs(); ++i) {
        tensorflow::int64 n = c->Value(c->NumElements(c->input(i)));
        if (n == InferenceContext::kUnknownDim) {
          c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
          return Status();
        }
        total += n;
      }
      c->set_output(0, c->Vector(total));
      return Status();
    })
    .Doc("Concatenates the flattened inputs into one 1-D tensor.");

REGISTER_OP("EplUnpack")
    .Input("packed: T")
    .Output("outputs: N * T")
    .Attr("N: int >= 1")
    .Attr("T: type")
    .Attr("shapes: list(shape)")
    .SetShapeFn([](InferenceContext* c) {
      std::vector<PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
      if (static_cast<int>(shapes.size()) != c->num_outputs()) {
        return InvalidArgument("EplUnpack: ", shapes.size(), " shapes for ",
                               c->num_outputs(), " outputs");
      }
      for (int i = 0; i < c->num_outputs(); ++i) {
        ShapeHandle out;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &out));
        c->set_output(i, out);
      }
      return Status();
    })
    .Doc("Splits a 1-D tensor made by EplPack back into tensors of the given shapes.");

class PackOp : public OpKernel {
 public:
  explicit PackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    OpInputList inputs;
    OP_REQUIRES_OK(ctx, ctx->input_list("inputs", &inputs));
    tensorflow::int64 total = 0;
    for (int i = 0; i < inputs.size(); ++i) total += inputs[i].NumElements();
    Tensor* packed = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &packed));
    char* dst = const_cast<char*>(packed->tensor_data().data());
    for (int i = 0; i < inputs.size(); ++i) {
      const auto bytes = inputs[i].tensor_data();
      if (bytes.size() > 0) std::memcpy(dst, bytes.data(), bytes.size());
      dst += bytes.size();
    }
  }
};

class UnpackOp : public OpKernel {
 public:
  explicit UnpackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::vector<PartialTensorShape> partial;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shapes", &partial));
    for (const auto& shape : partial) {
      TensorShape full;
      OP_REQUIRES(ctx, shape.AsTensorShape(&full),
                  InvalidArgument("EplUnpack ", name(), ": output ", shapes_.size(),
                                  " needs a fully defined shape, got ",
                                  shape.DebugString()));
      shapes_.push_back(full);
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& packed = ctx->input(0);
    OP_REQUIRES(ctx, packed.dims() == 1,
                InvalidArgument("EplUnpack ", name(), ": input 'packed' must be a 1-D "
                                "buffer, got shape ", packed.shape().DebugString()));
    tensorflow::int64 total = 0;
    for (const auto& shape : shapes_) total += shape.num_elements();
    OP_REQUIRES(ctx, total == packed.NumElements(),
                InvalidArgument("EplUnpack ", name(), ": the ", shapes_.size(),
                                " output shapes hold ", total,
                                " elements but input 'packed' has ", packed.NumElements()));
    const size_t element = packed.NumElements() > 0 ? packed.TotalBytes() / packed.NumElements()
                                                    : 1;
    const char* base = packed.tensor_data().data();
    tensorflow::int64 start = 0;
    for (size_t i = 0; i < shapes_.size(); ++i) {
      const tensorflow::int64 count = shapes_[i].num_elements();
      if (count > 0 && ViewAligned(base + start * element)) {  // share the buffer: no copy
        Tensor view;
        OP_REQUIRES(ctx, view.CopyFrom(packed.Slice(start, start + count), shapes_[i]),
                    InvalidArgument("EplUnpack ", name(), ": cannot view elements ", start,
                                    "..", start + count, " of input 'packed' as output ", i,
                                    " of shape ", shapes_[i].DebugString()));
        ctx->set_output(static_cast<int>(i), view);
      } else {
        Tensor* out = nullptr;
        OP_REQUIRES_OK(ctx, ctx->allocate_output(static_cast<int>(i), shapes_[i], &out));
        if (count > 0)
          std::memcpy(const_cast<char*>(out->tensor_data().data()), base + start * element,
                      count * element);
      }
      start += count;
    }
  }

 private:
  std::vector<TensorShape> shapes_;
};

#define EPL_REGISTER_FUSED(type)                                                 \
  REGISTER_KERNEL_BUILDER(                                                       \
      Name("EplPack").Device(DEVICE_CPU).TypeConstraint<type>("T"), PackOp);     \
  REGISTER_KERNEL_BUILDER(                                                       \
      Name("EplUnpack").Device(DEVICE_CPU).TypeConstraint<type>("T"), UnpackOp);

EPL_REGISTER_FUSED(Eigen::half);
EPL_REGISTER_FUSED(float);
EPL_REGISTER_FUSED(double);
EPL_REGISTER_FUSED(tensorflow::int32);
EPL_REGISTER_FUSED(tensorflow::int64);
#undef EPL_REGISTER_FUSED

}  // namespace epl
