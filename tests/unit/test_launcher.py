"""Unit tests for epl.launcher: its pure functions, and the console on pipes and
threads. Nothing here starts a process."""
import collections
import datetime
import io
import json
import os
import socket
import threading
import time

import pytest

from epl import launcher
from epl.launcher import ports as ports_module
from epl.launcher import (LaunchError, build_tf_config, default_log_dir, device_env,
                          exit_code_for, parse_args, plan_workers, task_dir, visible_gpu_ids,
                          worker_command)

BASE = ["--num_workers", "2", "--gpu_per_worker", "1"]
PY = "/opt/py/bin/python"


def _error(capsys, argv):
    """Run parse_args expecting an argparse error; return its stderr text."""
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


def _settings(argv, log_dir="logs"):
    return parse_args(argv)._replace(log_dir=log_dir)


# --- parse_args -------------------------------------------------------------

def test_parse_minimal_defaults():
    s = parse_args(BASE + ["train.py"])
    assert (s.num_workers, s.gpu_per_worker) == (2, 1)
    assert s.machine_list is None and s.machine_rank is None
    assert s.log_dir is None and s.task_label is None
    assert s.debug is False and s.script == "train.py" and s.script_args == ()


def test_settings_is_immutable():
    s = parse_args(BASE + ["train.py"])
    with pytest.raises(AttributeError):
        s.num_workers = 3


def test_script_args_pass_through_even_if_they_look_like_launcher_flags():
    s = parse_args(BASE + ["train.py", "--lr", "0.1", "--num_workers", "9", "--debug", "a b"])
    assert s.script_args == ("--lr", "0.1", "--num_workers", "9", "--debug", "a b")
    assert s.num_workers == 2 and s.debug is False


@pytest.mark.parametrize("missing", ["--num_workers", "--gpu_per_worker"])
def test_required_flags(capsys, missing):
    argv = list(BASE)
    pos = argv.index(missing)
    del argv[pos:pos + 2]
    assert missing in _error(capsys, argv + ["train.py"])


def test_script_is_required(capsys):
    assert "script" in _error(capsys, BASE)


@pytest.mark.parametrize("argv,named,meant", [
    (["--num_worker", "1", "--gpu_per_worker", "2", "train.py"], "--num_worker",
     "--num_workers"),
    (BASE + ["--log-dir", "logs", "train.py"], "--log-dir", "--log_dir"),
    (BASE + ["--gpu_per_worker=2", "--machine_rnak=0", "train.py"], "--machine_rnak",
     "--machine_rank"),
    (BASE + ["-v", "train.py"], "-v", None),
])
def test_a_typo_in_a_launcher_flag_names_it(capsys, argv, named, meant):
    """Before: argparse took the typo's value as the script and said the required flags
    were missing, never naming the typo."""
    err = _error(capsys, argv)
    assert "unrecognized launcher flag %s" % named in err
    assert "required" not in err
    assert ("did you mean %s?" % meant in err) if meant else "did you mean" not in err


def test_flags_after_the_script_are_the_scripts():
    s = parse_args(BASE + ["--debug", "true", "--log_dir=x", "train.py", "--num_worker", "1"])
    assert s.log_dir == "x" and s.script_args == ("--num_worker", "1")


@pytest.mark.parametrize("flag,value", [
    ("--num_workers", "0"), ("--num_workers", "-1"), ("--num_workers", "two"),
    ("--gpu_per_worker", "0"), ("--gpu_per_worker", "1.5"),
])
def test_bad_counts_name_flag_and_value(capsys, flag, value):
    argv = BASE + [flag, value, "train.py"]
    err = _error(capsys, argv)
    assert flag in err and value in err


def test_debug_is_a_true_flag():
    assert parse_args(BASE + ["--debug", "train.py"]).debug is True


@pytest.mark.parametrize("word,value", [
    ("True", True), ("true", True), ("TRUE", True), ("1", True),
    ("False", False), ("false", False), ("fAlSe", False), ("0", False),
])
def test_debug_takes_an_optional_boolean_word(word, value):
    # The original EPL declared --debug type=bool, so its users write "--debug True".
    s = parse_args(BASE + ["--debug", word, "train.py", "--x"])
    assert s.debug is value and s.script == "train.py" and s.script_args == ("--x",)
    assert parse_args(BASE + ["--debug=" + word, "train.py"]).debug is value


def test_debug_before_the_script_does_not_swallow_it():
    s = parse_args(["--debug"] + BASE + ["--debug", "run.sh", "out"])
    assert s.debug is True and s.script == "run.sh" and s.script_args == ("out",)


def test_debug_last_flag_before_double_dash():
    s = parse_args(BASE + ["--debug", "--", "train.py"])
    assert s.debug is True and s.script == "train.py"


def test_debug_explicit_bad_value_names_the_flag(capsys):
    err = _error(capsys, BASE + ["--debug=maybe", "train.py"])
    assert "--debug" in err and "maybe" in err


def test_explicit_debug_value_leaves_option_values_and_script_args_alone():
    argv = ["--log_dir", "True", "--debug", "0", "--num_workers", "1", "t.py", "--debug", "1"]
    assert launcher.explicit_debug_value(argv) == [
        "--log_dir", "True", "--debug=0", "--num_workers", "1", "t.py", "--debug", "1"]


def test_every_value_option_is_known_to_the_debug_scan():
    parser = launcher.settings._build_parser()
    takes_value = {flag for action in parser._actions if action.option_strings
                   and action.nargs is None for flag in action.option_strings}
    assert takes_value == set(launcher.settings.VALUE_FLAGS)


def test_machine_list_parsed_as_tuple():
    s = parse_args(BASE + ["--machine_list", "127.0.0.1:2000, localhost:2001", "t.py"])
    assert s.machine_list == ("127.0.0.1:2000", "localhost:2001")


@pytest.mark.parametrize("entry", [
    "127.0.0.1", "127.0.0.1:", ":2000", "127.0.0.1:0", "127.0.0.1:65536",
    "127.0.0.1:abc", "local host:2000",
])
def test_machine_list_bad_entries(capsys, entry):
    err = _error(capsys, BASE + ["--machine_list", "127.0.0.1:2000," + entry, "t.py"])
    assert "--machine_list" in err and entry.strip() in err


def test_machine_list_count_mismatch(capsys):
    err = _error(capsys, BASE + ["--machine_list", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
                                 "t.py"])
    assert "--machine_list" in err and "3 entries" in err and "--num_workers is 2" in err


def test_machine_rank_requires_machine_list(capsys):
    err = _error(capsys, BASE + ["--machine_rank", "0", "t.py"])
    assert "--machine_rank" in err and "--machine_list" in err


@pytest.mark.parametrize("rank", ["2", "-1", "x"])
def test_machine_rank_out_of_range(capsys, rank):
    err = _error(capsys, BASE + ["--machine_list", "a:1,b:2", "--machine_rank", rank, "t.py"])
    assert "--machine_rank" in err and rank in err


def test_remote_hosts_without_rank_are_rejected(capsys):
    err = _error(capsys, BASE + ["--machine_list", "127.0.0.1:1,10.0.0.2:2", "t.py"])
    assert "10.0.0.2:2" in err and "--machine_rank" in err


def test_local_hosts_without_rank_are_accepted():
    s = parse_args(["--num_workers", "3", "--gpu_per_worker", "1", "--machine_list",
                    "127.0.0.1:1,localhost:2,[::1]:3", "t.py"])
    assert s.machine_rank is None and len(s.machine_list) == 3


def test_task_label_must_be_path_safe(capsys):
    assert "--task_label" in _error(capsys, BASE + ["--task_label", "a/b", "t.py"])


# --- small pure helpers -------------------------------------------------------

@pytest.mark.parametrize("address,expected", [
    ("127.0.0.1:2222", ("127.0.0.1", 2222)), ("host-a:1", ("host-a", 1)),
    ("[::1]:65535", ("::1", 65535)), ("::1:80", ("::1", 80)),
])
def test_split_host_port(address, expected):
    assert launcher.split_host_port(address) == expected


@pytest.mark.parametrize("host,local", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("localhost", True), ("::1", True),
    ("10.0.0.1", False), ("myhost", False), ("0.0.0.0", False),
])
def test_is_local_host(host, local):
    assert launcher.is_local_host(host) is local


def test_tf_config_for_each_worker():
    hosts = ["127.0.0.1:1000", "127.0.0.1:1001", "127.0.0.1:1002"]
    for i in range(3):
        cfg = json.loads(build_tf_config(hosts, i))
        assert cfg == {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}}


def test_python_script_uses_given_interpreter():
    argv = worker_command("dir/train.py", ("--x", "a b", "$HOME;rm"), PY)
    assert argv == [PY, "dir/train.py", "--x", "a b", "$HOME;rm"]


def test_other_scripts_run_with_bash():
    argv = worker_command("run.sh", ["1", "two words"], PY)
    assert argv == ["bash", "run.sh", "1", "two words"]


def test_shell_scripts_get_the_task_dir_first():
    # Model-zoo scripts written for the original EPL read output_dir=$1.
    argv = worker_command("run.sh", ["1"], PY, task_dir="/jobs/a b")
    assert argv == ["bash", "run.sh", "/jobs/a b", "1"]


def test_python_scripts_never_get_a_task_dir_argument():
    assert worker_command("t.py", ["1"], PY, task_dir="/jobs/a") == [PY, "t.py", "1"]


@pytest.mark.parametrize("count,cvd,expected", [
    (0, None, []), (0, "0,1", []), (4, None, ["0", "1", "2", "3"]),
    (8, "3,5,7", ["3", "5", "7"]), (8, "", []), (8, "-1", []), (8, "2,-1,3", ["2"]),
    (2, "GPU-aaa,GPU-bbb", ["GPU-aaa", "GPU-bbb"]),
])
def test_visible_gpu_ids(count, cvd, expected):
    assert visible_gpu_ids(count, cvd) == expected


def test_device_env_gpu_blocks_are_contiguous_and_disjoint():
    ids = [str(i) for i in range(8)]
    blocks = [device_env(i, 2, ids)["CUDA_VISIBLE_DEVICES"] for i in range(4)]
    assert blocks == ["0,1", "2,3", "4,5", "6,7"]


def test_device_env_slices_within_preset_cuda_visible_devices():
    ids = visible_gpu_ids(8, "4,5,6,7")
    assert device_env(1, 2, ids) == {"CUDA_VISIBLE_DEVICES": "6,7"}


def test_device_env_virtual_cpu():
    assert device_env(3, 4, []) == {"EPL_NUM_VIRTUAL_DEVICES": "4"}


def test_default_log_dir():
    now = datetime.datetime(2024, 1, 2, 3, 4, 5)
    s = parse_args(["--num_workers", "4", "--gpu_per_worker", "2", "dir/train_mnist.py"])
    assert default_log_dir(s, now) == os.path.join("experiments",
                                                   "20240102-030405_4w2g_train_mnist")
    labelled = s._replace(task_label="lr0.1")
    assert default_log_dir(labelled, now).endswith("_4w2g_train_mnist_lr0.1")


@pytest.mark.parametrize("code,expected", [(3, 3), (-9, 137), (-15, 143), (0, 1)])
def test_exit_code_for(code, expected):
    assert exit_code_for(code) == expected


# --- plan_workers -------------------------------------------------------------

HOSTS = ["127.0.0.1:2000", "127.0.0.1:2001"]
ENV = {"PATH": "/bin", "TF_CONFIG": "stale", "EPL_NUM_VIRTUAL_DEVICES": "7"}


def test_plan_local_virtual_cpu():
    specs = plan_workers(_settings(BASE + ["t.py", "x"]), HOSTS, [], ENV, python=PY)
    assert [s.index for s in specs] == [0, 1]
    for i, spec in enumerate(specs):
        assert spec.argv == [PY, "t.py", "x"]
        assert json.loads(spec.env["TF_CONFIG"])["task"]["index"] == i
        assert spec.env["EPL_NUM_VIRTUAL_DEVICES"] == "1"
        assert spec.env["EPL_LAUNCH_LOG_DIR"] == "logs"
        assert spec.env["EPL_TASK_DIR"] == spec.task_dir == os.path.join("logs", str(i))
        assert spec.env["PYTHONUNBUFFERED"] == "1" and spec.env["PATH"] == "/bin"
        assert "EPL_DEBUG" not in spec.env and "CUDA_VISIBLE_DEVICES" not in spec.env
        assert spec.log_path == os.path.join("logs", "worker_%d.log" % i)
        assert spec.interactive is False
    assert ENV["TF_CONFIG"] == "stale"  # base env is not mutated


def test_plan_local_gpus_with_simulated_eight_gpus():
    settings = _settings(["--num_workers", "4", "--gpu_per_worker", "2", "t.sh"])
    hosts = ["127.0.0.1:%d" % p for p in range(2000, 2004)]
    specs = plan_workers(settings, hosts, visible_gpu_ids(8, None), ENV, python=PY)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0,1", "2,3", "4,5", "6,7"]
    assert all("EPL_NUM_VIRTUAL_DEVICES" not in s.env for s in specs)
    assert specs[0].argv == ["bash", "t.sh", os.path.join("logs", "0")]


def test_every_worker_gets_its_own_task_dir_as_the_original_did():
    """The original passed <log_dir>/<i> as $1; one shared directory made two workers
    of a model-zoo BERT script race on the same train.tf_record and predictions.json."""
    settings = _settings(["--num_workers", "3", "--gpu_per_worker", "1", "run.sh", "x"])
    hosts = ["127.0.0.1:%d" % p for p in range(2000, 2003)]
    specs = plan_workers(settings, hosts, [], ENV, python=PY)
    dirs = [os.path.join("logs", str(i)) for i in range(3)]
    assert [s.argv for s in specs] == [["bash", "run.sh", d, "x"] for d in dirs]
    assert [s.env["EPL_TASK_DIR"] for s in specs] == [s.task_dir for s in specs] == dirs
    assert all(s.env["EPL_LAUNCH_LOG_DIR"] == "logs" for s in specs)
    assert task_dir("/jobs/a", 7) == "/jobs/a/7"


def test_a_shell_script_finds_the_launchers_python_first_on_path():
    shell = plan_workers(_settings(BASE + ["run.sh"]), HOSTS, [], dict(ENV, PATH="/usr/bin"),
                         python=PY)
    assert [s.env["PATH"] for s in shell] == [os.path.join("logs", "bin") + ":/usr/bin"] * 2
    script = plan_workers(_settings(BASE + ["t.py"]), HOSTS, [], dict(ENV, PATH="/usr/bin"),
                          python=PY)
    assert [s.env["PATH"] for s in script] == ["/usr/bin"] * 2
    assert launcher.plan.python_shim("/my venv/bin/python").endswith(
        "exec '/my venv/bin/python' \"$@\"\n")


def test_plan_too_few_gpus_names_the_numbers():
    settings = _settings(["--num_workers", "3", "--gpu_per_worker", "4", "t.py"])
    hosts = ["127.0.0.1:%d" % p for p in range(2000, 2003)]
    with pytest.raises(LaunchError) as info:
        plan_workers(settings, hosts, visible_gpu_ids(8, None), ENV)
    message = str(info.value)
    assert "3 worker(s) x 4 GPU(s)" in message and "12" in message and "only 8" in message


def test_plan_machine_rank_runs_only_that_worker():
    hosts = ["10.0.0.1:2000", "10.0.0.2:2000", "10.0.0.3:2000"]
    settings = _settings(["--num_workers", "3", "--gpu_per_worker", "2", "--machine_list",
                          ",".join(hosts), "--machine_rank", "2", "t.py"])
    specs = plan_workers(settings, hosts, visible_gpu_ids(8, None), ENV, python=PY)
    assert len(specs) == 1 and specs[0].index == 2
    assert json.loads(specs[0].env["TF_CONFIG"]) == {
        "cluster": {"worker": hosts}, "task": {"type": "worker", "index": 2}}
    assert specs[0].env["CUDA_VISIBLE_DEVICES"] == "0,1"  # first block on its own machine
    assert specs[0].log_path == os.path.join("logs", "worker_2.log")


def test_plan_machine_rank_sharing_a_host_gets_next_gpu_block():
    hosts = ["10.0.0.1:2000", "10.0.0.1:2001", "10.0.0.2:2000"]
    settings = _settings(["--num_workers", "3", "--gpu_per_worker", "2", "--machine_list",
                          ",".join(hosts), "--machine_rank", "1", "t.py"])
    specs = plan_workers(settings, hosts, visible_gpu_ids(4, None), ENV)
    assert specs[0].env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_plan_machine_rank_needs_only_its_own_gpus():
    hosts = ["10.0.0.%d:2000" % i for i in range(8)]
    settings = _settings(["--num_workers", "8", "--gpu_per_worker", "8", "--machine_list",
                          ",".join(hosts), "--machine_rank", "5", "t.py"])
    specs = plan_workers(settings, hosts, visible_gpu_ids(8, None), ENV)
    assert specs[0].env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_plan_debug_makes_worker_zero_interactive():
    specs = plan_workers(_settings(BASE + ["--debug", "t.py"]), HOSTS, [], ENV)
    assert [s.interactive for s in specs] == [True, False]
    assert all(s.env["EPL_DEBUG"] == "1" for s in specs)


def test_plan_requires_resolved_log_dir():
    with pytest.raises(ValueError):
        plan_workers(parse_args(BASE + ["t.py"]), HOSTS, [], ENV)


def test_pick_free_ports_are_distinct_and_below_the_ephemeral_range():
    low = ports_module.ephemeral_low()
    ports = launcher.pick_free_ports(4)
    assert len(set(ports)) == 4
    assert all(max(1024, low - ports_module.SPAN) <= p < low for p in ports), (ports, low)


def test_pick_free_ports_skip_a_port_something_holds(monkeypatch):
    # Candidates 22936-22999 (no other test binds there); all but four are held, so the
    # pick must return exactly the four that bind.
    monkeypatch.setattr(ports_module, "SPAN", 64)
    low = 23000
    candidates = list(ports_module.candidate_range(low))
    assert candidates == list(range(22936, 23000))
    sockets = []
    try:
        for port in candidates[:-4]:
            sock = socket.socket()
            sockets.append(sock)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                pass  # taken by something else already: as good as held
        assert sorted(launcher.pick_free_ports(4, low=low)) == candidates[-4:]
    finally:
        for sock in sockets:
            sock.close()


def test_ports_fall_back_to_the_kernel_when_the_ephemeral_range_starts_low(tmp_path):
    assert len(ports_module.candidate_range(1050)) == 0
    ports = launcher.pick_free_ports(3, low=1050)
    assert len(set(ports)) == 3 and all(0 < p < 65536 for p in ports)
    path = tmp_path / "range"
    path.write_text("40000\t60999\n")
    assert ports_module.ephemeral_low(str(path)) == 40000
    assert ports_module.ephemeral_low(str(tmp_path / "missing")) == 32768


def test_main_reports_too_few_gpus(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    script = tmp_path / "t.py"
    script.write_text("")
    code = launcher.main(["--num_workers", "2", "--gpu_per_worker", "8",
                          "--log_dir", str(tmp_path / "logs"), str(script)],
                         detect_gpus=lambda: 8)
    assert code == 2
    assert "16 GPUs needed" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()


def test_main_reports_missing_script(tmp_path, capsys):
    code = launcher.main(BASE + [str(tmp_path / "nope.py")], detect_gpus=lambda: 0)
    assert code == 2 and "script not found" in capsys.readouterr().err


# --- console: line-atomic output (threads and pipes, no processes) -----------

def _console(limit=launcher.console.HELD_LINES_LIMIT):
    out = io.StringIO()
    return launcher.console.Console(out, held_limit=limit), out


def test_console_prints_lines_at_once_when_no_partial_line_is_open():
    console, out = _console()
    console.write_line("[worker 1] a\n")
    console.write_through("zero\n")
    console.write_line("[worker 2] b\n")
    assert out.getvalue() == "[worker 1] a\nzero\n[worker 2] b\n"


def test_console_holds_lines_while_the_through_worker_has_a_partial_line():
    console, out = _console()
    console.write_through("(Pdb) ")
    console.write_line("[worker 1] a\n")
    assert out.getvalue() == "(Pdb) "
    console.write_through("p x")
    console.write_through("\n1\n(Pdb) ")  # held lines go out before the new prompt
    assert out.getvalue() == "(Pdb) p x\n1\n[worker 1] a\n(Pdb) "


def test_console_end_through_finishes_the_partial_line():
    console, out = _console()
    console.write_through("no newline")
    console.write_line("[worker 1] a\n")
    console.end_through()
    assert out.getvalue() == "no newline\n[worker 1] a\n"
    console.end_through()  # idempotent: no stray blank line
    assert out.getvalue() == "no newline\n[worker 1] a\n"


def test_console_blocks_a_writer_beyond_the_held_limit():
    console, out = _console(limit=1)
    console.write_through("open")
    writer = threading.Thread(target=lambda: [console.write_line("[w1] %d\n" % i)
                                              for i in range(3)])
    writer.start()
    deadline = time.monotonic() + 10
    while len(console._held) < 1:  # wait for a state, not for a duration
        assert time.monotonic() < deadline
        time.sleep(0.001)
    console.write_through(" line\n")
    writer.join(timeout=10)
    assert not writer.is_alive()
    assert out.getvalue() == "open line\n[w1] 0\n[w1] 1\n[w1] 2\n"


def test_console_ignores_a_broken_stdout():
    class Broken(object):
        def write(self, text):
            raise BrokenPipeError()

        def flush(self):
            pass
    console = launcher.console.Console(Broken())
    console.write_line("x\n")
    console.write_through("y")
    console.end_through()


def test_pump_lines_logs_raw_and_prints_prefixed(tmp_path):
    console, out = _console()
    tail = collections.deque(maxlen=2)
    log_path = tmp_path / "w.log"
    stream = io.BytesIO(b"one\ntwo \xff\nthree")
    launcher.console.pump_lines(stream, 3, open(str(log_path), "ab"), console, tail)
    assert out.getvalue() == "[worker 3] one\n[worker 3] two \ufffd\n[worker 3] three\n"
    assert log_path.read_bytes() == b"one\ntwo \xff\nthree"
    assert list(tail) == ["two \ufffd", "three"]


def test_pump_through_passes_partial_lines_and_split_characters(tmp_path):
    console, out = _console()
    tail = collections.deque(maxlen=5)
    log_path = tmp_path / "w0.log"
    read_fd, write_fd = os.pipe()
    data = "é prompt> answer\nlast".encode("utf-8")
    for chunk in (data[:1], data[1:]):  # the "é" is split across two writes
        os.write(write_fd, chunk)
    os.close(write_fd)
    launcher.console.pump_through(read_fd, open(str(log_path), "ab"), console, tail)
    assert out.getvalue() == "é prompt> answer\nlast\n"
    assert log_path.read_bytes() == data
    assert list(tail) == ["é prompt> answer", "last"]
