"""Copy a set of ops into the same graph under a name prefix.

The copy is made with ``import_graph_def`` on the NodeDefs of the set, which
keeps gradients, while loops and conds intact, with three fix-ups TensorFlow
does not do for us:
  * every ``Enter`` gets a prefixed ``frame_name``, otherwise two loops share a
    frame and TF refuses to run ("more than one LoopCond");
  * inputs and control inputs from outside the set are re-pointed explicitly
    (``input_map``, or the caller's replacement);
  * colocation with ops outside the set is dropped (devices are set explicitly
    afterwards), and resource-variable ``shared_name``s are prefixed so each
    copy owns its variable.
"""
from epl import tf_adapter
from epl.tf_adapter import tf

_ENTER_TYPES = ("Enter", "RefEnter")


class CloneResult(object):
    """Mapping from source op/tensor to its copy."""

    def __init__(self, ops):
        self.ops = ops  # source op name -> new tf.Operation

    def op(self, source):
        return self.ops.get(source.name)

    def tensor(self, source):
        """Copy of a tensor if its producer was cloned, else None."""
        new_op = self.ops.get(source.op.name)
        return None if new_op is None else new_op.outputs[source.value_index]


def clone_ops(tf_graph, ops, prefix, replace=None, device_of=None):
    """Clone ``ops`` (a list of tf.Operation) under ``prefix``.

    Args:
      replace: optional dict {source tensor: tensor} for inputs from outside
        the set; other outside inputs are shared (the copy reads the original).
      device_of: optional function(source op) -> device string for the copy.

    Returns:
      CloneResult.
    """
    replace = replace or {}
    names = set(op.name for op in ops)
    graph_def, input_map, control_edges = _subgraph_def(tf_graph, ops, names, prefix, replace)
    if not graph_def.node:
        return CloneResult({})
    with tf_graph.as_default(), tf.name_scope(None), tf.device(None):
        imported = tf.import_graph_def(graph_def, input_map=input_map,
                                       return_elements=[op.name for op in ops], name=prefix)
    result = CloneResult(dict((src.name, new) for src, new in zip(ops, imported)))
    for src_name, controls in control_edges.items():
        tf_adapter.add_control_inputs(result.ops[src_name], controls)
    if device_of is not None:
        for src in ops:
            tf_adapter.set_device(result.ops[src.name], device_of(src))
    return result


def _subgraph_def(tf_graph, ops, names, prefix, replace):
    """NodeDefs of the set with outside edges removed and recorded."""
    graph_def = tf.GraphDef()
    graph_def.versions.CopyFrom(tf_graph.graph_def_versions)
    input_map, control_edges = {}, {}
    for op in ops:
        node = graph_def.node.add()
        node.CopyFrom(op.node_def)
        _fix_attrs(node, names, prefix)
        del node.input[:]
        for tensor in op.inputs:
            node.input.append(_tensor_ref(tensor))
            if tensor.op.name not in names:
                input_map[_tensor_ref(tensor)] = replace.get(tensor, tensor)
        outside = []
        for control in op.control_inputs:
            if control.name in names:
                node.input.append("^" + control.name)
            else:
                outside.append(control)
        if outside:
            control_edges[op.name] = outside
    _add_functions(tf_graph, graph_def, ops)
    return graph_def, input_map, control_edges


def _tensor_ref(tensor):
    return "%s:%d" % (tensor.op.name, tensor.value_index)


def _fix_attrs(node, names, prefix):
    if node.op in _ENTER_TYPES:
        frame = node.attr["frame_name"].s.decode()
        node.attr["frame_name"].s = ("%s/%s" % (prefix, frame)).encode()
    if "_class" in node.attr:
        kept = [loc for loc in node.attr["_class"].list.s
                if loc.decode()[len("loc:@"):] in names]
        if kept:
            del node.attr["_class"].list.s[:]
            node.attr["_class"].list.s.extend(kept)
        else:
            del node.attr["_class"]
    if node.op == "VarHandleOp" and node.attr["shared_name"].s:
        node.attr["shared_name"].s = ("%s/%s" % (prefix, node.attr["shared_name"].s.decode())
                                      ).encode()


def _add_functions(tf_graph, graph_def, ops):
    """Include the function library when a cloned op calls a function."""
    functions = tf_adapter.function_names(tf_graph)
    if functions and any(op.type in functions or _has_func_attr(op) for op in ops):
        graph_def.library.CopyFrom(tf_graph.as_graph_def().library)


def _has_func_attr(op):
    for value in op.node_def.attr.values():
        if value.HasField("func") or (value.HasField("list") and value.list.func):
            return True
    return False
