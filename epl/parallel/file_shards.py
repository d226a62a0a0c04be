"""IO slicing math: which input files each worker reads. Pure Python, no TensorFlow.

With ``io.slicing``, each *worker* (not each copy: the copies on one worker
share that worker's iterator) reads a share of every file list. Files are
dealt like cards, after sorting their names so that every worker deals the
same deck even if each built its list in a different order (``glob``,
``os.listdir``): file ``k`` goes to slot ``k % slots``. A worker owns a
contiguous range of slots, one per unit of its weight (its model replicas,
reduced by their common divisor), so a worker that pulls twice as many batches
per step gets twice as many files. With equal weights, worker ``r`` of ``n``
reads files ``r, r + n, r + 2n, ...`` (what ``Dataset.shard(n, r)`` would give).

Example: 7 files, 2 workers::

    >>> share = share_of(0, [1, 1])
    >>> worker_indices(7, share, unbalanced=True)
    [0, 2, 4, 6]
    >>> worker_indices(7, share_of(1, [1, 1]), drop_last=True)
    [1, 3, 5]

Every rule that refuses a file count has its message built here, so the
rewrite-time error (a constant file list) and the run-time assertion (a file
pattern) say the same thing.
"""
import collections
import functools
import math

from epl.checks import check_count

SLICING, UNBALANCED, DROP_LAST = "io.slicing", "io.unbalanced_io_slicing", "io.drop_last_files"


class IOSlicingError(ValueError):
    """A file list, a pattern or a combination of ``io.*`` keys EPL cannot slice."""


class Share(collections.namedtuple("Share", ["rank", "workers", "start", "stop", "slots"])):
    """Worker ``rank`` of ``workers`` owns slots ``[start, stop)`` of ``slots``.

    File ``k`` (in sorted order) belongs to slot ``k % slots``.
    """

    __slots__ = ()

    @property
    def divisor_text(self):
        """How the file count must divide, for messages."""
        if self.slots == self.workers:
            return "%d workers" % self.workers
        return ("%d shares (%d workers, each with shares in proportion to the model "
                "replicas it drives)" % (self.slots, self.workers))


def share_of(rank, weights):
    """The Share of worker ``rank`` when workers have ``weights`` (batches per step).

    Weights are reduced by their greatest common divisor, so equal weights
    give one slot per worker whatever the weight is.
    """
    weights = [check_count(w, "IO slicing weight of worker %d" % i, IOSlicingError)
               for i, w in enumerate(weights)]
    if not weights:
        raise IOSlicingError("IO slicing needs at least one reading worker, got none")
    if not 0 <= rank < len(weights):
        raise IOSlicingError("IO slicing: worker rank %r is out of range for %d reading "
                             "worker(s)" % (rank, len(weights)))
    divisor = functools.reduce(math.gcd, weights)
    units = [w // divisor for w in weights]
    start = sum(units[:rank])
    return Share(rank, len(weights), start, start + units[rank], sum(units))


def check_options(slicing, drop_last, unbalanced):
    """Refuse ``io.*`` combinations that would be ignored or contradict each other."""
    if not slicing:
        for key, value in ((DROP_LAST, drop_last), (UNBALANCED, unbalanced)):
            if value:
                raise IOSlicingError(
                    "%s=True only applies when %s=True, but %s is False, so every worker "
                    "would read every file and %s would be ignored. Set %s=True, or set %s "
                    "back to False." % (key, SLICING, SLICING, key, SLICING, key))
    if drop_last and unbalanced:
        raise IOSlicingError(
            "%s=True and %s=True ask for opposite things when the files do not divide "
            "evenly among workers: drop the last files, or keep them and give some workers "
            "one file more. Set at most one of them to True." % (DROP_LAST, UNBALANCED))


# ---- messages (shared by rewrite-time errors and run-time assertions) ----------------
def too_few_message(source, count, share):
    """Fewer files than shares: some worker would have nothing to read."""
    return ("%s: %s has %s file(s) for %s. Every worker needs at least one file: a worker "
            "with nothing to read would stop at once while the others wait for it in "
            "collectives (a hang). Split the data into at least %d files, or set %s=False "
            "so that every worker reads every file (neither %s nor %s changes this)."
            % (SLICING, source, count, share.divisor_text, share.slots, SLICING,
               DROP_LAST, UNBALANCED))


def uneven_message(source, count, share):
    """A file count that does not divide by the number of shares."""
    return ("%s: %s has %s files, which do not divide evenly among %s. Set %s=True to drop "
            "the last files so that every worker reads the same number, or %s=True to let "
            "some workers read one file more (then a worker may run out of data before the "
            "others: repeat the dataset, or the others wait for it in collectives)."
            % (SLICING, source, count, share.divisor_text, DROP_LAST, UNBALANCED))


def empty_message(source):
    """A pattern (or a fed list) with no files at all."""
    return ("%s: %s has no files, so there is nothing to share among workers. Check the "
            "path (every worker must see the same files), or set %s=False."
            % (SLICING, source, SLICING))


# ---- the deal -------------------------------------------------------------------------
def check_count_of_files(num_files, share, drop_last, unbalanced, source):
    """Raise IOSlicingError unless ``num_files`` can be shared as the keys ask."""
    if num_files == 0:
        raise IOSlicingError(empty_message(source))
    if num_files < share.slots:
        raise IOSlicingError(too_few_message(source, num_files, share))
    if num_files % share.slots and not (drop_last or unbalanced):
        raise IOSlicingError(uneven_message(source, num_files, share))


def kept_count(num_files, share, drop_last):
    """How many files are dealt: all, or (``drop_last``) a multiple of the slots."""
    return num_files - num_files % share.slots if drop_last else num_files


def worker_indices(num_files, share, drop_last=False, unbalanced=False, source="the file list"):
    """Sorted-order indices of the files ``share``'s worker reads (checked first)."""
    check_count_of_files(num_files, share, drop_last, unbalanced, source)
    kept = kept_count(num_files, share, drop_last)
    return [k for k in range(kept) if share.start <= k % share.slots < share.stop]


def worker_files(files, share, drop_last=False, unbalanced=False, source="the file list"):
    """The names of ``files`` that ``share``'s worker reads, in sorted order."""
    ordered = sorted(files)
    return [ordered[k] for k in worker_indices(len(ordered), share, drop_last, unbalanced,
                                               source)]
