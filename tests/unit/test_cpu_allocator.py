"""EPL's choice of TensorFlow's CPU allocator (epl.cluster.cpu_allocator): BFC for CPU
jobs, with the machine's memory as its limit, unless the user chose."""
from epl.cluster import cpu_allocator
from epl.cluster.cpu_allocator import BFC_VARIABLE, LIMIT_VARIABLE, choose, prefer_bfc


def test_a_cpu_job_gets_bfc_limited_by_the_machines_memory():
    assert choose({}, "CPU", 24105) == {BFC_VARIABLE: "1", LIMIT_VARIABLE: "24105"}


def test_any_choice_of_the_user_is_kept():
    for value in ("0", "1", "false", ""):
        assert choose({BFC_VARIABLE: value}, "CPU", 24105) == {}
    # the user's own limit stays; BFC is still chosen
    assert choose({LIMIT_VARIABLE: "4096"}, "CPU", 24105) == {BFC_VARIABLE: "1"}


def test_gpu_jobs_keep_tensorflows_default():
    assert choose({}, "GPU", 24105) == {}


def test_without_the_machines_memory_tensorflows_own_limit_stays():
    assert choose({}, "CPU", None) == {BFC_VARIABLE: "1"}


def test_prefer_bfc_sets_the_variables_once(monkeypatch):
    monkeypatch.setattr(cpu_allocator, "physical_memory_mb", lambda: 1000)
    environ = {"OTHER": "x"}
    assert prefer_bfc("CPU", environ) == {BFC_VARIABLE: "1", LIMIT_VARIABLE: "1000"}
    assert environ == {"OTHER": "x", BFC_VARIABLE: "1", LIMIT_VARIABLE: "1000"}
    assert prefer_bfc("CPU", environ) == {}  # a second epl.init: already chosen


def test_the_machines_memory_is_known_here():
    assert cpu_allocator.physical_memory_mb() > 512
