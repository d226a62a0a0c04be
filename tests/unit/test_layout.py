"""Layout math on simulated clusters (pure functions, up to 512 devices)."""
import pytest

from epl.cluster.layout import LayoutError, local_replicas, ordered_devices, replica_layout


def test_row_and_column_order():
    assert ordered_devices(2, 2, True) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert ordered_devices(2, 2, False) == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_two_stages_on_four_devices_interleave_replicas():
    layout = replica_layout(1, 4, [1, 1])
    assert layout == [[((0, 0),), ((0, 1),)], [((0, 2),), ((0, 3),)]]


def test_data_parallel_one_device_per_replica():
    layout = replica_layout(2, 2, [1])
    assert [r[0] for r in layout] == [((0, 0),), ((0, 1),), ((1, 0),), ((1, 1),)]


def test_multi_device_replica_takes_consecutive_devices():
    layout = replica_layout(1, 4, [2])
    assert layout == [[((0, 0), (0, 1))], [((0, 2), (0, 3))]]


def test_pipeline_across_workers_with_one_device_each():
    assert replica_layout(2, 1, [1, 1]) == [[((0, 0),), ((1, 0),)]]


def test_column_order_spreads_a_replica_over_nodes():
    layout = replica_layout(2, 2, [1, 1], prefer_intra_node=False)
    assert layout == [[((0, 0),), ((1, 0),)], [((0, 1),), ((1, 1),)]]


def test_colocated_taskgraphs_share_devices():
    layout = replica_layout(2, 8, [8, 8], colocate=True)
    assert len(layout) == 2
    for replica in layout:
        assert replica[0] == replica[1]
        assert len(replica[0]) == 8


def test_colocated_counts_must_match():
    with pytest.raises(LayoutError, match="same device_count.*TaskGraph 1: 2"):
        replica_layout(1, 4, [4, 2], colocate=True)


def test_impossible_layout_names_the_numbers():
    with pytest.raises(LayoutError) as err:
        replica_layout(1, 3, [1, 1], names=["stage_0", "stage_1"])
    message = str(err.value)
    assert "needs 2 devices" in message and "has 3 devices" in message
    assert "(stage_0): 1" in message and "1 workers x 3 devices" in message


@pytest.mark.parametrize("count", [0, -1, 1.5, True, None])
def test_bad_device_count(count):
    with pytest.raises(LayoutError, match="device_count"):
        replica_layout(1, 4, [count])


@pytest.mark.parametrize("workers,per_worker,counts,intra", [
    (64, 8, [1], True), (64, 8, [1, 1, 1, 1], True), (64, 8, [2, 2], False),
    (32, 16, [4, 4, 4, 4], True), (512, 1, [1, 1], True), (128, 4, [8], True),
])
def test_large_clusters_use_every_device_exactly_once(workers, per_worker, counts, intra):
    layout = replica_layout(workers, per_worker, counts, prefer_intra_node=intra)
    total = workers * per_worker
    assert len(layout) == total // sum(counts)
    used = [d for replica in layout for tg in replica for d in tg]
    assert sorted(used) == sorted(ordered_devices(workers, per_worker))
    for replica in layout:
        assert [len(tg) for tg in replica] == counts


def test_prefer_intra_node_keeps_replicas_inside_a_worker_at_scale():
    layout = replica_layout(64, 8, [1, 1, 1, 1], prefer_intra_node=True)
    for replica in layout:
        assert len({w for tg in replica for w, _ in tg}) == 1
    column = replica_layout(64, 8, [1, 1, 1, 1], prefer_intra_node=False)
    for replica in column:
        assert len({w for tg in replica for w, _ in tg}) == 4


def test_local_replicas():
    layout = replica_layout(2, 2, [1])
    assert local_replicas(layout, 0, 0) == [0, 1]
    assert local_replicas(layout, 0, 1) == [2, 3]
