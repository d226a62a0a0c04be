"""Find the file lists of a graph's file-reading input pipelines (IO slicing's search).

A *file list* is the string tensor whose elements a reader dataset opens as
files. In TF 1.15 graph mode, ``TFRecordDataset(files)``, ``TextLineDataset``
and ``FixedLengthRecordDataset`` all become ``TensorSliceDataset(files)``
feeding a ``FlatMapDataset`` / ``(Parallel)InterleaveDataset`` whose function
holds the reader op; ``Dataset.list_files(pattern)`` is a ``MatchingFiles``
op feeding a ``TensorSliceDataset``; ``from_tensor_slices(names).interleave(
TFRecordDataset)`` nests the reader one function deeper. So a file list is
the input of a string ``TensorSliceDataset`` whose elements reach a dataset
function that (at any depth) opens files, or the file name input of a reader
op itself.

Where the pipeline lives depends on the iterator:

* ``make_initializable_iterator`` (and Estimator input_fns): in the main
  graph, up to ``MakeIterator``;
* ``make_one_shot_iterator``: TF copies the whole pipeline into the
  iterator's ``dataset_factory`` function; the main-graph copy is dead.

This module reads a GraphDef and its function library (plain protos) and
returns records; it changes nothing. Lists inside per-element functions (the
inner ``TFRecordDataset(name)`` of an interleave) are not file lists: they
depend on a function argument, one file at a time.
"""
import collections
import re

from epl.tf_adapter import tf

READERS = frozenset(["TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset",
                     "FixedLengthRecordDatasetV2"])
USER_SHARDS = frozenset(["ShardDataset", "AutoShardDataset", "ExperimentalAutoShardDataset"])
ONE_SHOT_ITERATORS = frozenset(["OneShotIterator"])
SLICE_DATASETS = frozenset(["TensorSliceDataset"])
# Ops that pass a file list through unchanged (list_files' Identity, flat_filenames' Reshape).
TRANSPARENT = frozenset(["Identity", "Reshape", "Squeeze", "StopGradient", "Snapshot"])
MATCHING_FILES = "MatchingFiles"
_DATASET_OP = re.compile(r"Dataset(V\d+)?$")


class FileList(collections.namedtuple("FileList", [
        "consumer", "files", "pattern", "source", "readers", "user_shards"])):
    """One file list found in a graph body.

    consumer: name of the node whose input 0 is the list (what IO slicing rewires);
    files: the names (bytes) when the list is a constant, else None (a run-time list);
    pattern: the glob of a ``MatchingFiles`` source (text), else None;
    source: how messages name the list; readers: reader op types that open it;
    user_shards: names of ``Dataset.shard`` ops already applied downstream.
    """

    __slots__ = ()

    @property
    def static(self):
        return self.files is not None


Factory = collections.namedtuple("Factory", ["iterator", "function", "file_lists"])
Factory.__doc__ = """A one-shot iterator whose dataset_factory function holds file lists:
iterator op name, the FunctionDef, and its FileList records (consumers are body nodes)."""


def function_library(graph_def):
    """{name: FunctionDef} of a GraphDef's library."""
    return dict((f.signature.name, f) for f in graph_def.library.function)


def function_attrs(node_def):
    """Names of the functions a NodeDef refers to (``f``, ``dataset_factory``, lists)."""
    names = []
    for value in node_def.attr.values():
        if value.HasField("func"):
            names.append(value.func.name)
        elif value.HasField("list"):
            names.extend(f.name for f in value.list.func)
    return names


def readers_in(name, library, memo=None):
    """Reader op types that function ``name`` runs, at any nesting depth."""
    memo = {} if memo is None else memo
    if name in memo:
        return memo[name]
    memo[name] = frozenset()  # recursion guard
    fdef = library.get(name)
    found = set()
    for node in (fdef.node_def if fdef is not None else ()):
        if node.op in READERS:
            found.add(node.op)
        for inner in function_attrs(node):
            found |= readers_in(inner, library, memo)
    memo[name] = frozenset(found)
    return memo[name]


def is_dataset_op(op_type):
    return bool(_DATASET_OP.search(op_type))


class Body(object):
    """The nodes of one graph body (the main graph, or a function) as NodeDefs.

    Inputs are ``"node:index"`` in a GraphDef and ``"node:arg:index"`` in a
    function; a bare name that is no node is a function argument.
    """

    def __init__(self, node_defs, where):
        self.where = where
        self.nodes = collections.OrderedDict((n.name, n) for n in node_defs)
        self._consumers = collections.defaultdict(list)
        for node in self.nodes.values():
            for name in self.data_inputs(node):
                self._consumers[name].append(node)

    @staticmethod
    def producer_name(input_text):
        return input_text.lstrip("^").split(":")[0]

    def data_inputs(self, node):
        return [self.producer_name(i) for i in node.input if not i.startswith("^")]

    def producer(self, node, index=0):
        """The NodeDef producing data input ``index`` of ``node`` (None: an argument)."""
        data = [i for i in node.input if not i.startswith("^")]
        return self.nodes.get(self.producer_name(data[index]))

    def downstream(self, node):
        """Every node reachable from ``node`` through data edges (excluding it)."""
        seen, order, todo = set([node.name]), [], [node.name]
        while todo:
            for consumer in self._consumers.get(todo.pop(), ()):
                if consumer.name not in seen:
                    seen.add(consumer.name)
                    order.append(consumer)
                    todo.append(consumer.name)
        return order

    def trace(self, node, index=0):
        """The node that really produces data input ``index`` of ``node``, looking
        through ops that pass a list unchanged; None when it is a function argument."""
        current = self.producer(node, index)
        while current is not None and current.op in TRANSPARENT:
            current = self.producer(current, 0)
        return current


def attr(node, key):
    """AttrValue ``key`` of a NodeDef, or None. (``node.attr[key]`` would *add* an
    empty attribute to the proto, which TF later rejects as an unbound placeholder.)"""
    return node.attr[key] if key in node.attr else None


def constant_strings(node):
    """The flattened values of a string Const NodeDef, or None."""
    if node is None or node.op != "Const":
        return None
    dtype, value = attr(node, "dtype"), attr(node, "value")
    if dtype is None or value is None or dtype.type != tf.string.as_datatype_enum:
        return None
    return tuple(tf.make_ndarray(value.tensor).reshape(-1).tolist())


def _string_slices(node):
    if node.op not in SLICE_DATASETS:
        return False
    types = attr(node, "Toutput_types")
    return types is not None and list(types.list.type) == [tf.string.as_datatype_enum]


def _readers_downstream(node, down, library, memo):
    if node.op in READERS:
        return frozenset([node.op])
    found = set()
    for consumer in down:
        for name in function_attrs(consumer):
            found |= readers_in(name, library, memo)
    return frozenset(found)


def _pattern(body, source):
    if source is None or source.op != MATCHING_FILES:
        return None
    values = constant_strings(body.trace(source, 0))
    if values is None:
        return "<a computed pattern>"
    return ", ".join(v.decode("utf-8", "replace") for v in values)


def _source_text(body, source, readers):
    readers_text = "/".join(sorted(readers))
    where = "" if body.where is None else " in %s" % body.where
    pattern = _pattern(body, source)
    if pattern is not None:
        return pattern, "file pattern %r (read by %s%s)" % (pattern, readers_text, where)
    return None, "file list %r (read by %s%s)" % (source.name, readers_text, where)


def find_in(body, library, live_only, memo=None):
    """FileList records of ``body``. ``live_only``: skip pipelines that reach no
    iterator (the dead main-graph twin of a one-shot iterator's pipeline)."""
    memo = {} if memo is None else memo
    found = []
    for node in body.nodes.values():
        if not (_string_slices(node) or node.op in READERS):
            continue
        down = body.downstream(node)
        readers = _readers_downstream(node, down, library, memo)
        if not readers:
            continue
        if live_only and all(is_dataset_op(d.op) for d in down):
            continue
        source = body.trace(node, 0)
        if source is None:  # a function argument: one element at a time
            continue
        pattern, text = _source_text(body, source, readers)
        shards = tuple(d.name for d in down if d.op in USER_SHARDS)
        found.append(FileList(node.name, constant_strings(source), pattern, text, readers,
                              shards))
    return found


def find_file_lists(graph_def):
    """(main-graph FileLists, [Factory]) of a GraphDef."""
    library = function_library(graph_def)
    memo = {}
    main = find_in(Body(graph_def.node, None), library, live_only=True, memo=memo)
    factories = []
    for node in graph_def.node:
        if node.op not in ONE_SHOT_ITERATORS:
            continue
        factory = attr(node, "dataset_factory")
        fdef = library.get(factory.func.name) if factory is not None else None
        if fdef is None:
            continue
        body = Body(fdef.node_def, "the dataset of one-shot iterator %r" % node.name)
        lists = find_in(body, library, live_only=False, memo=memo)
        if lists:
            factories.append(Factory(node.name, fdef, lists))
    return main, factories
