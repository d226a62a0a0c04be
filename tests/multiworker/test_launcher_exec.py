"""epl.launcher with real processes: tiny non-TF worker scripts, no mocks.

Each test writes its worker script to tmp_path. Workers find out who they are
from TF_CONFIG, exactly as a real EPL worker would."""
import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import tensorflow.compat.v1 as tf

from epl import launcher
from eplutil import user_examples

REPO = str(Path(__file__).resolve().parents[2])

PRELUDE = """\
import json, os, subprocess, sys, time
INDEX = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
"""


def _script(tmp_path, body, name="worker.py"):
    path = tmp_path / name
    text = textwrap.dedent(body)
    path.write_text(PRELUDE + text if name.endswith(".py") else text)
    return str(path)


def _pid_alive(pid):
    """A zombie counts as gone: it no longer runs, it just awaits reaping."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2] != "Z"
    except OSError:
        return False


def _wait_for_files(paths, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text().endswith("\n") for p in paths):
        assert time.monotonic() < deadline, "workers did not start: %s" % paths
        time.sleep(0.05)


def _read_pids(paths):
    return [int(x) for p in paths for x in p.read_text().split()]


def _run_main(tmp_path, argv, capsys, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    code = launcher.main(["--log_dir", str(tmp_path / "logs")] + argv, detect_gpus=lambda: 0)
    return code, capsys.readouterr()


@pytest.mark.timeout(60)
def test_all_workers_succeed(tmp_path, capsys, monkeypatch):
    script = _script(tmp_path, """
        print("hello from", INDEX, "devices", os.environ["EPL_NUM_VIRTUAL_DEVICES"])
        print("args", sys.argv[1:], "logdir", os.environ["EPL_LAUNCH_LOG_DIR"])
        print("unbuffered", os.environ["PYTHONUNBUFFERED"], "debug",
              os.environ.get("EPL_DEBUG"))
        print("task dir", os.environ["EPL_TASK_DIR"])  # and no extra positional argument
    """)
    code, out = _run_main(tmp_path, ["--num_workers", "3", "--gpu_per_worker", "2",
                                     script, "--lr", "a b"], capsys, monkeypatch)
    assert code == 0, out.err
    assert "3 worker(s) x 2 virtual CPU device(s)" in out.out
    logs = tmp_path / "logs"
    for i in range(3):
        assert "[worker %d] hello from %d devices 2\n" % (i, i) in out.out
        assert "[worker %d] args ['--lr', 'a b'] logdir %s\n" % (i, logs) in out.out
        log = (logs / ("worker_%d.log" % i)).read_text()
        assert log.startswith("hello from %d devices 2\n" % i)  # raw, no prefix
        assert "unbuffered 1 debug None" in log
        assert "task dir %s\n" % (logs / str(i)) in log


@pytest.mark.timeout(60)
def test_each_worker_gets_its_own_tf_config(tmp_path, capsys, monkeypatch):
    script = _script(tmp_path, """
        print("CONFIG", os.environ["TF_CONFIG"])
    """)
    code, out = _run_main(tmp_path, ["--num_workers", "2", "--gpu_per_worker", "1", script],
                          capsys, monkeypatch)
    assert code == 0, out.err
    configs = {}
    for line in out.out.splitlines():
        if " CONFIG " in line:
            cfg = json.loads(line.split(" CONFIG ", 1)[1])
            configs[cfg["task"]["index"]] = cfg
    assert sorted(configs) == [0, 1]
    hosts = configs[0]["cluster"]["worker"]
    assert len(hosts) == 2 and len(set(hosts)) == 2
    assert all(h.startswith("127.0.0.1:") for h in hosts)
    assert configs[1]["cluster"]["worker"] == hosts


@pytest.mark.timeout(60)
def test_failed_worker_stops_the_others(tmp_path):
    pid_file = tmp_path / "pid1"
    script = _script(tmp_path, """
        if INDEX == 1:
            with open(sys.argv[1] + ".tmp", "w") as f:
                f.write("%d\\n" % os.getpid())
            os.rename(sys.argv[1] + ".tmp", sys.argv[1])
            time.sleep(1000)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.02)
        for n in range(1, 26):
            print("line", n)
        sys.exit(3)
    """)
    settings = launcher.parse_args(["--num_workers", "2", "--gpu_per_worker", "1",
                                    "--log_dir", str(tmp_path / "logs"), script,
                                    str(pid_file)])
    hosts = ["127.0.0.1:%d" % p for p in launcher.pick_free_ports(2)]
    specs = launcher.plan_workers(settings, hosts, [], dict(os.environ))
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    code = launcher.execute(specs, stdout=out, stderr=err)
    assert code == 3
    assert time.monotonic() - start < 8
    report = err.getvalue()
    assert "epl-launch: worker 0 failed with exit code 3" in report
    assert "line 25\n" in report and "line 6\n" in report and "line 5\n" not in report
    assert not _pid_alive(_read_pids([pid_file])[0])
    assert "[worker 0] line 25" in out.getvalue()


@pytest.mark.timeout(120)
def test_the_failure_summary_leads_with_the_tensorflow_error(tmp_path):
    """TF prints the failing node's original stack trace after the error, so the last 20
    lines held only frames. Before: the summary was those 20 lines, without the error."""
    script = _script(tmp_path, """
        import tensorflow.compat.v1 as tf
        tf.disable_eager_execution()
        x = tf.placeholder(tf.float32, [None])
        check = tf.Assert(tf.reduce_all(x > 0), ["x must be positive", x], name="positive")
        with tf.control_dependencies([check]):
            y = tf.identity(x)
        with tf.Session() as sess:
            sess.run(y, {x: [1.0, -1.0]})
    """)
    settings = launcher.parse_args(["--num_workers", "1", "--gpu_per_worker", "1",
                                    "--log_dir", str(tmp_path / "logs"), script])
    specs = launcher.plan_workers(settings, ["127.0.0.1:1"], [],
                                  dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    err = io.StringIO()
    assert launcher.execute(specs, stdout=io.StringIO(), stderr=err) == 1
    lines = err.getvalue().split("\n")
    assert lines[:2] == ["epl-launch: worker 0 failed with exit code 1",
                         "--- error of worker 0 ---"]
    tail = [i for i, line in enumerate(lines) if line.startswith("--- last 20 lines of ")]
    assert tail, err.getvalue()
    lead = lines[2:tail[0]]
    assert "InvalidArgumentError: " in lead[0]
    assert any(line.endswith("assertion failed: [x must be positive] [1 -1]") for line in lead)
    if tf.version.VERSION.startswith("1."):
        assert lead[-2].lstrip().startswith("[[node positive/AssertGuard/Assert (defined at ")
        # the user's line, below TensorFlow's frames. TF 1.15 drops the leading part that the
        # path shares with TensorFlow's own files ("/" here, "/tmp/" when both are in /tmp)
        assert lead[-1].startswith("failing node: positive/AssertGuard/Assert (created at ")
        created = lead[-1].rsplit(" (created at ", 1)[1]
        assert created.endswith(".py:7)") and script.endswith(created[:-3]), lead[-1]
    else:   # TF 2.x: the Assert runs inside the cond's function, with no original trace
        assert lead[-1] == "failing node: Assert"


@pytest.mark.timeout(60)
def test_worker_ignoring_sigterm_is_killed_after_grace(tmp_path):
    pid_file = tmp_path / "pid1"
    script = _script(tmp_path, """
        import signal
        if INDEX == 1:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with open(sys.argv[1], "w") as f:
                f.write("%d\\n" % os.getpid())
            time.sleep(1000)
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.02)
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    settings = launcher.parse_args(["--num_workers", "2", "--gpu_per_worker", "1",
                                    "--log_dir", str(tmp_path / "logs"), script,
                                    str(pid_file)])
    specs = launcher.plan_workers(settings, ["127.0.0.1:1", "127.0.0.1:2"], [],
                                  dict(os.environ))
    err = io.StringIO()
    start = time.monotonic()
    code = launcher.execute(specs, grace_period=0.5, stdout=io.StringIO(), stderr=err)
    elapsed = time.monotonic() - start
    assert code == 128 + signal.SIGKILL
    assert "worker 0 failed with exit code 137 (killed by SIGKILL)" in err.getvalue()
    assert 0.5 <= elapsed < 8
    assert not _pid_alive(_read_pids([pid_file])[0])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum,expected", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_stops_every_worker(tmp_path, signum, expected):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    script = _script(tmp_path, """
        child = subprocess.Popen(["sleep", "1000"])  # grandchild: must die too
        path = os.path.join(sys.argv[1], str(INDEX))
        with open(path + ".tmp", "w") as f:
            f.write("%d %d\\n" % (os.getpid(), child.pid))
        os.rename(path + ".tmp", path)
        time.sleep(1000)
    """)
    env = dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "epl.launcher", "--num_workers", "2", "--gpu_per_worker",
             "1", "--log_dir", str(tmp_path / "logs"), script, str(pid_dir)],
            env=env, stdout=out, stderr=err, cwd=str(tmp_path))
        try:
            pid_files = [pid_dir / "0", pid_dir / "1"]
            _wait_for_files(pid_files)
            pids = _read_pids(pid_files)
            assert all(_pid_alive(p) for p in pids)
            proc.send_signal(signum)
            assert proc.wait(timeout=20) == expected
        finally:
            if proc.poll() is None:
                proc.kill()
    assert not [p for p in pids if _pid_alive(p)]
    name = signal.Signals(signum).name
    assert "received %s, stopping workers" % name in (tmp_path / "err").read_text()


@pytest.mark.timeout(60)
def test_shell_script_gets_the_task_dir_first(tmp_path, capsys, monkeypatch):
    """Each worker gets its own <log_dir>/<i> (created) as $1, as under the original: a
    model-zoo script that writes output_dir=$1/train.tf_record writes one file each."""
    script = _script(tmp_path, """\
        echo "bash=${BASH_VERSION:+yes} args=$1|$2|$3 devices=$EPL_NUM_VIRTUAL_DEVICES"
        [[ "$1" == "$EPL_TASK_DIR" ]] && echo "task dir in \\$1 and EPL_TASK_DIR"
        [[ "$TF_CONFIG" == *'"index": 1'* ]] && echo "I am one"
        [[ -e "$1/train.tf_record" ]] && echo "already written"
        echo "$TF_CONFIG" > "$1/train.tf_record"
        exit 0
    """, name="run.sh")
    code, out = _run_main(tmp_path, ["--num_workers", "2", "--gpu_per_worker", "4", script,
                                     "x y", "$HOME"], capsys, monkeypatch)
    assert code == 0, out.err
    for i in range(2):
        task_dir = tmp_path / "logs" / str(i)
        assert "[worker %d] bash=yes args=%s|x y|$HOME devices=4\n" % (i, task_dir) in out.out
        assert "[worker %d] task dir in $1 and EPL_TASK_DIR\n" % i in out.out
        assert '"index": %d' % i in (task_dir / "train.tf_record").read_text()
    assert "[worker 1] I am one" in out.out and "[worker 0] I am one" not in out.out
    assert "already written" not in out.out


@pytest.mark.timeout(60)
def test_a_shell_scripts_python_is_the_launchers(tmp_path, capsys, monkeypatch):
    """Before: `python` in a shell script was whatever the caller's PATH had (here none:
    "python: command not found"; in a shell without the venv activated, a Python
    without TensorFlow)."""
    script = _script(tmp_path, """\
        python -c 'import sys; print("python is", sys.executable)'
        python3 -c 'import sys; print("python3 is", sys.executable)'
    """, name="run.sh")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    code, out = _run_main(tmp_path, ["--num_workers", "1", "--gpu_per_worker", "1", script],
                          capsys, monkeypatch)
    assert code == 0, out.err
    assert "[worker 0] python is %s\n" % sys.executable in out.out
    assert "[worker 0] python3 is %s\n" % sys.executable in out.out


@pytest.mark.timeout(180)
def test_the_quick_start_shell_script_runs_from_any_directory(tmp_path, capsys, monkeypatch,
                                                              tmp_path_factory):
    """Before: run.sh said `python local_model.py`, which fails unless the caller's
    directory is examples/quick_start ("can't open file 'local_model.py'")."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    monkeypatch.setenv("PYTHONPATH", REPO)
    script = os.path.join(user_examples(tmp_path_factory), "quick_start", "run.sh")
    code, out = _run_main(tmp_path, ["--num_workers", "1", "--gpu_per_worker", "2", script],
                          capsys, monkeypatch)
    assert code == 0, out.err + out.out[-3000:]
    lines = out.out.strip().split("\n")
    assert lines[-1] == "[worker 0] Train Finished."
    # Its own output is not drowned in TF's (before: 10 deprecation warnings with their
    # instructions and 6 C++ info lines around its 11 lines; the example turns them off)
    assert [line for line in lines if "Iteration" in line] == lines[-11:-1]
    # On TF 2.x the tf.compat.v1 switch (docs/tf2.md) warns before the program's own
    # logging line runs, and Keras warns about tf.layers through Python's warnings module.
    if tf.version.VERSION.startswith("1."):
        assert len(lines) == 12, "\n".join(lines)   # the launcher's line and the example's 11


@pytest.mark.timeout(60)
def test_relative_log_dir_becomes_an_absolute_task_dir(tmp_path, capsys, monkeypatch):
    script = _script(tmp_path, """
        os.chdir("/")  # a script that moves elsewhere must still find its task dir
        print("task", os.path.isdir(os.environ["EPL_TASK_DIR"]), os.environ["EPL_TASK_DIR"])
    """)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    code = launcher.main(["--num_workers", "1", "--gpu_per_worker", "1", "--log_dir", "rel",
                          script], detect_gpus=lambda: 0)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "[worker 0] task True %s\n" % (tmp_path / "rel" / "0") in out.out


# Worker 0 leaves a partial line open (as a pdb prompt does) until worker 1's
# line has certainly reached the launcher (it is in worker_1.log, which the
# launcher writes before printing). Lines of the two workers must still come
# out whole, in either order. The loop polls for that state; it is not a sleep
# that makes a race unlikely.
DEBUG_WORKER = """
    if INDEX == 1:
        print("one-line", os.environ.get("EPL_DEBUG"))
        print("stdin", repr(sys.stdin.readline()))
        sys.exit(0)
    sys.stdout.write("zero-start|")
    sys.stdout.flush()
    log1 = os.path.join(os.environ["EPL_LAUNCH_LOG_DIR"], "worker_1.log")
    while "one-line" not in (open(log1).read() if os.path.exists(log1) else ""):
        time.sleep(0.01)
    print("zero-end", "tty" if os.isatty(1) else "pipe", os.environ.get("EPL_DEBUG"))
    print("stdin", repr(sys.stdin.readline()))  # only worker 0 has our stdin
"""


def _debug_argv(tmp_path, script, debug=("--debug",)):
    return [sys.executable, "-m", "epl.launcher", "--num_workers", "2", "--gpu_per_worker",
            "1"] + list(debug) + ["--log_dir", str(tmp_path / "logs"), script]


def _check_debug_output(tmp_path, stdout, kind):
    """Every line is whole: no line of worker 1 inside one of worker 0."""
    lines = [line for line in stdout.splitlines() if not line.startswith("epl-launch: ")]
    expected = ["zero-start|zero-end %s 1" % kind, "stdin 'typed\\n'",
                "[worker 1] one-line 1", "[worker 1] stdin ''"]
    assert sorted(lines) == sorted(expected), stdout
    assert lines.index(expected[0]) < lines.index(expected[1])
    log0 = (tmp_path / "logs" / "worker_0.log").read_text()
    assert log0 == "zero-start|zero-end %s 1\nstdin 'typed\\n'\n" % kind
    assert (tmp_path / "logs" / "worker_1.log").read_text().startswith("one-line 1\n")


@pytest.mark.timeout(60)
def test_debug_worker_zero_uses_the_terminal(tmp_path):
    script = _script(tmp_path, DEBUG_WORKER)
    env = dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(_debug_argv(tmp_path, script), env=env, input=b"typed\n",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30,
                            cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    _check_debug_output(tmp_path, result.stdout.decode(), "pipe")


def _run_on_pty(argv, stdin_bytes, env, cwd, timeout=30.0):
    """Run `argv` with stdout on a new pty (as in a terminal); returns (exit code,
    stdout with the pty's \\r\\n turned back into \\n, stderr)."""
    master, slave = pty.openpty()
    with open(os.path.join(cwd, "stderr"), "wb") as err:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.PIPE, stdout=slave,
                                stderr=err)
    os.close(slave)
    try:
        proc.stdin.write(stdin_bytes)
        proc.stdin.close()
        chunks, deadline = [], time.monotonic() + timeout
        # poll, not select: in a long test run this process holds over 1024 descriptors
        # (TF servers cannot be shut down), and select() refuses such numbers.
        poller = select.poll()
        poller.register(master, select.POLLIN)
        while time.monotonic() < deadline:
            if poller.poll(500):
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer of the pty has exited
                    break
                if not data:
                    break
                chunks.append(data)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    output = b"".join(chunks).decode().replace("\r\n", "\n")
    return code, output, open(os.path.join(cwd, "stderr")).read()


@pytest.mark.timeout(60)
def test_debug_worker_zero_on_a_terminal_sees_a_terminal(tmp_path):
    script = _script(tmp_path, DEBUG_WORKER)
    env = dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
    code, stdout, stderr = _run_on_pty(_debug_argv(tmp_path, script, ("--debug", "True")),
                                       b"typed\n", env, str(tmp_path))
    assert code == 0, stderr
    _check_debug_output(tmp_path, stdout, "tty")


@pytest.mark.timeout(60)
def test_debug_false_is_not_debug_mode(tmp_path, capsys, monkeypatch):
    script = _script(tmp_path, """
        print("debug", os.environ.get("EPL_DEBUG"))
    """)
    code, out = _run_main(tmp_path, ["--num_workers", "1", "--gpu_per_worker", "1",
                                     "--debug", "False", script], capsys, monkeypatch)
    assert code == 0, out.err
    assert "[worker 0] debug None\n" in out.out  # prefixed: not the pass-through worker
