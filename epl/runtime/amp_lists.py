"""Which ops AMP O1 runs in float16: four op-type lists, after TF's grappler AMP.

* ``ALLOW``: compute-bound ops that are fast and numerically safe in float16
  (matrix products and convolutions); always converted when they can be;
* ``INFER``: elementwise arithmetic that is safe in float16 but not worth a cast
  on its own; converted when it sits between two allowed ops and no denied op
  is upstream of it;
* ``DENY``: ops that need float32's range or precision (exponentials and
  logarithms, softmax and cross-entropies, sums and means); never converted,
  and they keep the infer ops downstream of them in float32;
* ``CLEAR``: ops that do no arithmetic (reshapes, slices, comparisons, relu);
  they follow their neighbours.

Every other op type stays float32. The lists are our own selection, informed
by TF 1.15's grappler lists (``auto_mixed_precision_lists.h``); ``Prod`` is
denied here (a product overflows float16 quickly) and the backward-only ops of
grappler's lists are absent because AMP rewrites the forward graph only.

``NO_HALF_KERNEL`` names listed ops that have no float16 kernel on a device
kind in the installed TensorFlow (the CPU set is per TF version, from
:mod:`epl.tf_adapter`; checked against TF's kernel registry by
tests/graph/test_amp.py); on such devices they stay float32.

Apart from that table, this module uses nothing from TensorFlow.
"""
from epl import tf_adapter

ALLOW, INFER, DENY, CLEAR = "allow", "infer", "deny", "clear"

_ALLOW = """
BatchMatMul BatchMatMulV2 BlockLSTM Conv2D Conv2DBackpropFilter Conv2DBackpropInput Conv3D
Conv3DBackpropFilterV2 Conv3DBackpropInputV2 CudnnRNN CudnnRNNV2 CudnnRNNV3
DepthwiseConv2dNative Einsum GRUBlockCell LSTMBlockCell MatMul
"""
_INFER = """
Add AddN AddV2 AvgPool AvgPool3D BiasAdd BiasAddV1 Elu Erf Erfc FloorDiv FusedBatchNormV2
FusedBatchNormV3 Inv LeakyRelu Mul RealDiv Reciprocal Selu Sigmoid Softplus Sqrt Sub Tanh
"""
_DENY = """
Cumprod Cumsum EuclideanNorm Exp Expm1 L2Loss Log Log1p LogSoftmax Mean Pow Prod
SegmentSum Softmax SoftmaxCrossEntropyWithLogits SparseSoftmaxCrossEntropyWithLogits Sum
UnsortedSegmentSum
"""
_CLEAR = """
Abs ArgMax ArgMin BatchToSpace BatchToSpaceND BroadcastTo Ceil CheckNumerics ClipByValue
Concat ConcatV2 DepthToSpace DynamicPartition DynamicStitch EnsureShape Equal ExpandDims
Fill Floor Gather GatherNd GatherV2 Greater GreaterEqual Identity IsFinite IsInf IsNan Less
LessEqual Max MaxPool MaxPool3D MaxPoolV2 Maximum Min Minimum MirrorPad Neg NotEqual OneHot
OnesLike Pack Pad PadV2 PreventGradient Relu Relu6 Reshape ResizeNearestNeighbor Reverse
ReverseSequence ReverseV2 Round Select SelectV2 Shape ShapeN Sign Size Slice Snapshot
SpaceToBatch SpaceToBatchND SpaceToDepth Split SplitV Squeeze StopGradient StridedSlice Tile
TopK TopKV2 Transpose Unpack Where ZerosLike
"""

LISTS = {
    ALLOW: frozenset(_ALLOW.split()),
    INFER: frozenset(_INFER.split()),
    DENY: frozenset(_DENY.split()),
    CLEAR: frozenset(_CLEAR.split()),
}

# device kind -> listed op types without a float16 kernel there (they depend on the
# TensorFlow version: TF 2.x has a CPU float16 Einsum, TF 1.15.5 does not)
NO_HALF_KERNEL = {
    "CPU": tf_adapter.LISTED_OPS_WITHOUT_CPU_HALF_KERNEL,
    "GPU": frozenset(),
}


def kind_of(op_type):
    """ALLOW, INFER, DENY, CLEAR or None (an unlisted op stays float32)."""
    for kind, types in LISTS.items():
        if op_type in types:
            return kind
    return None


def has_half_kernel(op_type, device_kind):
    """False for listed ops known to lack a float16 kernel on ``device_kind``."""
    return op_type not in NO_HALF_KERNEL.get(device_kind, frozenset())
