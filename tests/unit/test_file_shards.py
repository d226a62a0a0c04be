"""IO slicing's deal of files to workers (pure functions, no TensorFlow)."""
import pytest

from epl.parallel.file_shards import (IOSlicingError, Share, check_options, share_of,
                                      worker_files, worker_indices)

FILES = ["f%d" % i for i in range(7)]


def _deal(num_files, workers, **flags):
    return [worker_indices(num_files, share_of(r, [1] * workers), **flags)
            for r in range(workers)]


def _assert_partition(shares, kept):
    flat = sorted(k for share in shares for k in share)
    assert flat == list(range(kept))


def test_equal_weights_give_one_slot_per_worker():
    assert share_of(1, [1, 1, 1]) == Share(1, 3, 1, 2, 3)
    assert share_of(2, [4, 4, 4]) == Share(2, 3, 2, 3, 3)  # reduced by the common divisor


def test_even_files_are_dealt_round_robin():
    shares = _deal(8, 2)
    assert shares == [[0, 2, 4, 6], [1, 3, 5, 7]]
    _assert_partition(shares, 8)


@pytest.mark.parametrize("num_files,workers", [(7, 2), (10, 4), (5, 3), (9, 8)])
def test_unbalanced_gives_some_workers_one_more_file(num_files, workers):
    shares = _deal(num_files, workers, unbalanced=True)
    _assert_partition(shares, num_files)
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) == 1
    assert sizes == sorted(sizes, reverse=True)  # the first workers get the extra files


@pytest.mark.parametrize("num_files,workers", [(7, 2), (10, 4), (5, 3), (9, 8)])
def test_drop_last_drops_the_tail_so_shares_are_equal(num_files, workers):
    shares = _deal(num_files, workers, drop_last=True)
    kept = num_files - num_files % workers
    _assert_partition(shares, kept)
    assert len(set(len(s) for s in shares)) == 1


def test_weighted_workers_get_files_in_proportion():
    # worker 0 drives 2 replicas, worker 1 drives 1: slots 0-1 and 2 of 3
    assert share_of(0, [2, 1]) == Share(0, 2, 0, 2, 3)
    shares = [worker_indices(6, share_of(r, [2, 1])) for r in range(2)]
    assert shares == [[0, 1, 3, 4], [2, 5]]


def test_names_are_sorted_before_the_deal_so_every_worker_agrees():
    share = share_of(0, [1, 1])
    assert worker_files(["c", "a", "d", "b"], share) == ["a", "c"]
    assert worker_files(["d", "c", "b", "a"], share) == ["a", "c"]


def test_uneven_count_without_a_flag_names_counts_and_both_keys():
    with pytest.raises(IOSlicingError) as info:
        worker_files(FILES, share_of(0, [1, 1]), source="file list 'names'")
    message = str(info.value)
    for text in ("7 files", "2 workers", "io.drop_last_files=True",
                 "io.unbalanced_io_slicing=True", "file list 'names'"):
        assert text in message


@pytest.mark.parametrize("flags", [{}, {"unbalanced": True}, {"drop_last": True}])
def test_fewer_files_than_workers_is_an_error_whatever_the_flags(flags):
    with pytest.raises(IOSlicingError) as info:
        worker_files(["a", "b"], share_of(0, [1, 1, 1]), **flags)
    message = str(info.value)
    assert "2 file(s) for 3 workers" in message and "hang" in message
    assert "io.slicing=False" in message


def test_no_files_is_an_error():
    with pytest.raises(IOSlicingError, match="has no files"):
        worker_files([], share_of(0, [1, 1]), unbalanced=True)


def test_weighted_messages_explain_the_shares():
    with pytest.raises(IOSlicingError, match=r"3 shares \(2 workers"):
        worker_files(["a", "b", "c", "d"], share_of(0, [2, 1]))


def test_one_worker_reads_everything():
    assert worker_files(FILES, share_of(0, [1])) == sorted(FILES)


def test_option_combinations():
    check_options(True, True, False)
    check_options(True, False, True)
    check_options(False, False, False)
    with pytest.raises(IOSlicingError, match="opposite things"):
        check_options(True, True, True)
    for flags, key in (((False, True, False), "io.drop_last_files"),
                       ((False, False, True), "io.unbalanced_io_slicing")):
        with pytest.raises(IOSlicingError) as info:
            check_options(*flags)
        assert "%s=True only applies when io.slicing=True" % key in str(info.value)


@pytest.mark.parametrize("rank,weights", [(2, [1, 1]), (0, []), (0, [0, 1]), (0, [True])])
def test_bad_shares_are_refused(rank, weights):
    with pytest.raises(IOSlicingError):
        share_of(rank, weights)
