"""``epl.add_to_collection`` and friends: tensors whose fetched value EPL merges."""
from epl.ir.collections import GraphKeys
from epl.ir.graph import Graph


def add_to_collection(objs, key):
    """Ask EPL to merge ``objs`` (a tensor or list of tensors) as ``key`` says.

    Seed API: ``epl.add_to_collection(loss, epl.GraphKeys.GLOBAL_MEAN_OBJECTS)``;
    fetching ``loss`` then returns its mean over micro-batches and replicas.
    Any subset of the tensors of one call can be fetched in a step. A tensor
    belongs to one collection: adding it under a second key is an error
    (fetching it could return only one of the two merges).
    """
    if key not in GraphKeys.ALL:
        raise ValueError("epl.add_to_collection: unknown key %r; use one of epl.GraphKeys: %s"
                         % (key, ", ".join(GraphKeys.ALL)))
    objs = list(objs) if isinstance(objs, (list, tuple)) else [objs]
    for obj in objs:
        if not hasattr(obj, "graph") or not hasattr(obj, "dtype"):
            raise TypeError("epl.add_to_collection(%r, %s): only tensors can be merged"
                            % (obj, key))
        collections = Graph.get(obj.graph).collections
        for other, members in collections.items():
            if other != key and obj in members:
                raise ValueError("epl.add_to_collection(%s, %s): the tensor is already in %s; "
                                 "a fetched tensor has one merged value, so it can be in one "
                                 "collection only (merge a tf.identity of it for the other)"
                                 % (obj.name, key, other))
        if obj not in collections[key]:
            collections[key].append(obj)


def get_collection(key, graph=None):
    """Tensors added under ``key`` (in the default graph unless given)."""
    return list(Graph.get(graph).collections.get(key, []))


def get_all_collections(graph=None):
    """``{key: [tensors]}`` for every key of ``epl.GraphKeys.ALL_COLLECTION_KEYS``
    (empty lists included). The original EPL returned a list of lists in the order
    of ``ALL_COLLECTION_KEYS``: ``[d[k] for k in GraphKeys.ALL_COLLECTION_KEYS]``."""
    return dict((k, list(v)) for k, v in Graph.get(graph).collections.items())
