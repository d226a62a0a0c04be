"""tools/equivalence_table.py builds docs/tf2.md's table from a run's log: each
equivalence section is a column (a CI run prints the TF 1.15 leg's, then the TF 2.x
leg's), each test lands in one mode, and a mode shows its count and its largest
difference per column."""
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "equivalence_table.py")
_SPEC = importlib.util.spec_from_file_location("equivalence_table", SCRIPT)
table = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(table)

LOG = """
........ [100%]
=========== equivalence: max |weight - serial weight| per test ===========
2.98e-08  tests/graph/test_pipeline.py::test_pipeline_matches_serial[preferforward]
5.96e-08  tests/graph/test_pipeline.py::test_pipeline_matches_serial[preferbackward]
3.12e-05  tests/graph/test_savers.py::test_amp_savers_match_float32_serial[amp+zero_v1-ga_2]
1.49e-08  tests/graph/test_savers.py::test_float32_savers_match_serial[zero_v1+grouped-ga_2]
4.66e-10  tests/graph/test_comm_options.py::test_gradients_reduce_method_sum
=========== 1600 passed in 870.00s ===========
make check-nccl
=========== equivalence: max |weight - serial weight| per test ===========
7.45e-09  tests/graph/test_pipeline.py::test_pipeline_matches_serial[preferforward]
1.2e-07  tests/graph/test_comm_options.py::test_gradients_reduce_method_sum
"""


def test_modes_take_the_first_rule_that_matches():
    assert table.mode_of("t.py::test_amp_savers_match_float32_serial[amp+zero_v1-ga_2]") \
        .startswith("AMP")
    assert table.mode_of("t.py::test_float32_savers_match_serial[zero_v1+grouped-ga_2]") \
        .startswith("ZeRO")
    assert table.mode_of("t.py::test_float32_savers_match_serial[gc+offload+grouped-dp_1x2]") \
        .startswith("Memory savers combined")
    assert table.mode_of("tests/graph/test_offload.py::test_corpus[bert-single]") == "Offload"
    assert table.mode_of("tests/graph/test_comm_options.py::test_max_splits_buckets[1-tf]") \
        .startswith("DP (local)")


def test_each_section_is_a_column_with_counts_and_maxima(tmp_path):
    log = tmp_path / "ci.log"
    log.write_text(LOG)
    out = subprocess.run([sys.executable, SCRIPT, str(log), "--labels", "TF1", "TF2"],
                         stdout=subprocess.PIPE, universal_newlines=True, check=True,
                         timeout=60).stdout
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines()[2:]}
    pipelines = rows["Pipelines (both schedules; DP over pipelines)"]
    assert pipelines.endswith("| 2 / 1 | 5.96e-08 | 7.45e-09 |")
    assert rows["ZeRO v0/v1/v2 (with checkpoints, savers)"].endswith("| 1 / 0 | 1.49e-08 | - |")
    assert rows["AMP (float16 compute vs float32 serial)"].endswith("| 1 / 0 | 3.12e-05 | - |")
    local_dp = rows["DP (local), communication options, odd shapes"]
    assert local_dp.endswith("| 1 / 1 | 4.66e-10 | 1.2e-07 |")
    assert len(rows) == 4


def test_a_log_without_a_section_is_an_error(tmp_path):
    log = tmp_path / "ci.log"
    log.write_text("1 passed\n")
    result = subprocess.run([sys.executable, SCRIPT, str(log)], stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=60)
    assert result.returncode != 0 and "no section" in result.stderr


def test_the_script_reads_the_section_the_suite_prints():
    with open(os.path.join(ROOT, "tests", "conftest.py")) as handle:
        assert '"%s"' % table.HEADER in handle.read()
