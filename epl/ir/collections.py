"""``epl.GraphKeys``: tensors whose value is merged across micro-batches/replicas.

``LOCAL_*`` tensors are merged over the micro-batches of one replica;
``GLOBAL_*`` tensors also over every replica of every worker. Fetching such a
tensor returns the merged value.
"""


class GraphKeys(object):
    """Collection names for merged outputs (seed API: ``epl.GraphKeys``)."""

    GLOBAL_MEAN_OBJECTS = "global_mean_objects"
    GLOBAL_SUM_OBJECTS = "global_sum_objects"
    GLOBAL_CONCAT_OBJECTS = "global_concat_objects"
    LOCAL_MEAN_OBJECTS = "local_mean_objects"
    LOCAL_SUM_OBJECTS = "local_sum_objects"
    LOCAL_CONCAT_OBJECTS = "local_concat_objects"

    ALL = (GLOBAL_MEAN_OBJECTS, GLOBAL_SUM_OBJECTS, GLOBAL_CONCAT_OBJECTS,
           LOCAL_MEAN_OBJECTS, LOCAL_SUM_OBJECTS, LOCAL_CONCAT_OBJECTS)
    ALL_COLLECTION_KEYS = ALL   # the original EPL's name

    @staticmethod
    def describe(key):
        """(scope, reduction) of a key, e.g. ('global', 'mean')."""
        scope, reduction, _ = key.split("_")
        return scope, reduction
