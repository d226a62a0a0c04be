"""Automatic mixed precision O1 (``amp.level="O1"``) with float32 master weights.

Example::

    epl.init(epl.Config({"amp.level": "O1", "amp.loss_scale": "dynamic"}))
    loss = model(features)                      # built in float32, as usual
    train = tf.train.AdamOptimizer(1e-3).minimize(loss, global_step=step)

Plugged into :mod:`epl.runtime.build_time`:

* :func:`wrap_gradients` (``tf.gradients``): before TensorFlow builds the
  gradients, the forward ops between the variables and the loss are painted
  (:mod:`epl.runtime.amp_lists`, :mod:`epl.runtime.amp_paint`) and the float16
  ones are rebuilt as float16 twins (:mod:`epl.runtime.amp_convert`), so the
  backward pass runs through them too. Variables stay float32 and no float16
  copy of a weight is kept: each use casts just in time. Then the loss is
  scaled (through ``grad_ys``) and the gradients come back divided by the scale
  (:mod:`epl.runtime.amp_scale`).
* :func:`wrap_apply` (``apply_gradients``): the update happens only if every
  gradient the optimizer receives is finite; the loss scale state is updated
  every step (dynamic: x2 after ``GROWTH_INTERVAL`` good steps, /2 on a
  non-finite step, never below 1). A skipped step leaves weights, slots and
  ``global_step`` unchanged.

``INITIAL_SCALE`` and ``GROWTH_INTERVAL`` are read when the graph is built
(tests monkeypatch them). See docs/amp.md.
"""
import collections
import logging

from epl import tf_adapter
from epl.ir.features import FeatureSlot
from epl.runtime import amp_scale
from epl.runtime.amp_convert import ForwardConverter
from epl.tf_adapter import tf

INITIAL_SCALE = 2.0 ** 15
GROWTH_INTERVAL = 2000

LOG = logging.getLogger("epl.amp")


class AmpState(object):
    """AMP's records for one graph: the ops it made, its conversions, its loss scales."""

    def __init__(self):
        self.created = set()                            # names of ops AMP made
        self.conversions = []                           # amp_convert.Conversion per call
        self.loss_scales = collections.OrderedDict()    # tuple of ys -> LossScale
        self.finite_flags = []                          # the step's "all finite" bools

    @property
    def converted(self):
        """[(original op name, float16 op name)] over every tf.gradients call."""
        return [pair for conversion in self.conversions for pair in conversion.converted]


_STATES = FeatureSlot("amp", AmpState)


def applies(config):
    return config.amp.level == "O1"


def state(graph=None):
    """AMP's records (:class:`AmpState`) for a ``tf.Graph`` (default graph), or None."""
    return _STATES.for_graph(graph)


def _state(view):
    return _STATES.of(view)


def finite_flags(view):
    """The bool tensors that decide whether a step applies (one per apply_gradients
    call under AMP). Every replica computes its own from the gradients it holds: a
    rewrite that leaves replicas different gradients (ZeRO v1) must make them agree."""
    amp = _STATES.get(view)
    return list(amp.finite_flags) if amp is not None else []


def wrap_gradients(compute, build):
    """``tf.gradients`` with float16 forward ops and a scaled loss."""
    view, config = build.view, build.config

    def amp_gradients(call):
        ys = [_as_tensor(y) for y in call.ys]
        _check_losses(ys)
        if tf_adapter.control_flow_context(view.tf_graph) is not None:
            LOG.warning("EPL AMP: tf.gradients called inside a while loop or cond is left "
                        "in float32 and unscaled")
            return compute(call)
        amp = _state(view)
        xs, grad_ys = list(call.xs), list(call.grad_ys)
        protected = set(t for t in ys + xs + grad_ys + list(call.stop_gradients)
                        if isinstance(t, tf.Tensor))
        device_kind = build.cluster.device_type
        converter = ForwardConverter(view, device_kind, amp.created)
        conversion = converter.convert(ys, xs, protected)
        amp.conversions.append(conversion)
        _warn_cpu_once(conversion, device_kind)
        loss_scale = _loss_scale(amp, view, ys, config)
        if config.amp.debug_log:
            _log_conversion(conversion, loss_scale)
        result = compute(call._replace(grad_ys=loss_scale.scaled_grad_ys(ys, grad_ys)))
        converter.recast_for_backward(conversion)
        return result._replace(grad_ys=call.grad_ys, grads=loss_scale.unscale(result.grads))
    return amp_gradients


def wrap_apply(call, build):
    """``apply_gradients`` that applies only finite steps and updates the loss scale."""
    view = build.view

    def amp_apply(record):
        grads = [g for g, _ in record.grads_and_vars]
        amp = _STATES.get(view)
        scales = []
        if amp is not None and grads:
            scales = amp_scale.scales_feeding(grads, list(amp.loss_scales.values()), view)
        if not scales:  # gradients not made by tf.gradients under AMP
            return call(record)
        return amp_scale.apply_if_finite(view, call, record, scales, GROWTH_INTERVAL,
                                         amp.finite_flags)
    return amp_apply


def _as_tensor(value):
    return value if isinstance(value, (tf.Tensor, tf.IndexedSlices)) \
        else tf.convert_to_tensor(value)


def _check_losses(ys):
    for y in ys:
        if not y.dtype.base_dtype.is_floating:
            raise TypeError("amp.level=O1 scales the loss, so tf.gradients needs floating "
                            "point ys; %s is %s" % (y.name, y.dtype.base_dtype.name))


def _loss_scale(amp, view, ys, config):
    key = tuple(ys)
    if key not in amp.loss_scales:
        info = view.info(ys[0].op)
        amp.loss_scales[key] = amp_scale.LossScale(
            view, info.taskgraph if info is not None else None, config.amp.loss_scale,
            config.amp.debug_log, INITIAL_SCALE)
    return amp.loss_scales[key]


_CPU_WARNED = []


def _warn_cpu_once(conversion, device_kind):
    """float16 kernels on CPU are far slower than float32 ones: say so once per process
    when AMP converts ops that run on CPUs."""
    on_cpu = [twin for _, twin in conversion.converted if device_kind == "CPU"]
    if not on_cpu or _CPU_WARNED:
        return
    _CPU_WARNED.append(True)
    LOG.warning("EPL AMP: amp.level=O1 runs %d op(s) in float16 on CPU devices. TensorFlow's "
                "float16 kernels on CPU are far slower than float32 ones (a 3-layer, "
                "1024-wide MLP: 81 ms per step in float32, 12.3 s with AMP). AMP pays off on "
                "GPUs; on CPUs use it to test a configuration, not to train. (Said once.)",
                len(on_cpu))


def _log_conversion(conversion, loss_scale):
    if not LOG.isEnabledFor(logging.INFO):
        LOG.setLevel(logging.INFO)  # the user asked for this log
    if not LOG.hasHandlers():
        LOG.addHandler(logging.StreamHandler())
    LOG.info("EPL AMP: %d op(s) run in float16: %s", len(conversion.converted),
             ", ".join(name for name, _ in conversion.converted) or "none")
    for name, reason in conversion.kept:
        LOG.info("EPL AMP: %s stays float32 (%s)", name, reason)
    LOG.info("EPL AMP: loss scale %s", "dynamic, starting at %g, growing every %d good steps"
             % (INITIAL_SCALE, GROWTH_INTERVAL) if loss_scale.dynamic
             else "fixed at %g" % loss_scale.fixed)
