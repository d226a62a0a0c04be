"""Where benchmark results go and what they record: commands, environment, tables.

Every benchmark writes ``<out>/<name>.json`` (for tools) and ``<out>/<name>.md`` (for
people), stamped with the command line, date, machine and revision, so that two result
files can be judged comparable. Committed results carry no machine's paths
(``portable_path``). Reached through :mod:`common`, which re-exports these names; like
it, this module never imports TensorFlow.
"""
import datetime
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def format_command(argv):
    """A shell-quoted command line that can be pasted back into a terminal."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def portable_path(path):
    """``path`` as committed result files record it: relative to the checkout when
    inside it (``.venv/bin/python``, ``benchmarks/dp_worker.py``), otherwise only its
    last component (an interpreter found on PATH, a temporary log directory).

    Results are committed, so they must not carry one machine's directories; the
    relative forms still work when pasted at the repository root, where every job
    runs (``run_command`` uses ``cwd=REPO``)."""
    text = str(path)
    if not os.path.isabs(text):
        return text
    if text == REPO or text.startswith(REPO + os.sep):
        return os.path.relpath(text, REPO)
    return os.path.basename(text.rstrip(os.sep)) or text


def portable_command(argv):
    """``format_command`` of ``argv`` with every absolute path made ``portable_path``;
    for result files (failure reports keep the real paths, which help locally)."""
    return format_command([portable_path(a) for a in argv])


def git_revision():
    """Current commit (plus '-dirty' when the tree has changes), or None; read-only."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, timeout=10,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              universal_newlines=True)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, timeout=10, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, universal_newlines=True)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def git_changes(paths=("epl", "csrc")):
    """Uncommitted changes (``git status --porcelain`` lines) under ``paths``, or None.

    Recorded because a '-dirty' revision alone does not say whether the code
    being measured (EPL itself) differs from the commit; read-only."""
    try:
        done = subprocess.run(["git", "status", "--porcelain", "--"] + list(paths), cwd=REPO,
                              timeout=10, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              universal_newlines=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line for line in done.stdout.splitlines() if line.strip()] \
        if done.returncode == 0 else None


def environment_info(argv=None):
    """Everything needed to judge whether two result files are comparable."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = None
    return {
        "command": portable_command([sys.executable] + list(sys.argv if argv is None else argv)),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_revision": git_revision(),
        "loadavg_start": load_average(),
    }


def load_average():
    """1/5/15-minute load average, or None. Recorded because on a small machine
    any other busy process (a test run, a build) directly lowers the numbers."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def markdown_table(headers, rows):
    """A GitHub Markdown table; numbers are formatted by the caller."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out.extend("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)
    return "\n".join(out)


def read_results(out_dir, name):
    """The payload :func:`write_results` wrote to ``<out_dir>/<name>.json``, or None
    if there is none (or it does not parse): what ``--merge`` starts from."""
    try:
        with open(os.path.join(out_dir, "%s.json" % name)) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def write_results(out_dir, name, payload, markdown):
    """Write ``<out_dir>/<name>.json`` and ``.md``, and the benchmark's picture
    ``<name>.png`` if it has one (pictures.py); returns the paths written.

    Files are written to a temporary name and renamed, so an interrupted run
    never leaves a half-written result next to good ones."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for ext, text in (("json", json.dumps(payload, indent=2, sort_keys=True) + "\n"),
                      ("md", markdown.rstrip("\n") + "\n")):
        path = os.path.join(out_dir, "%s.%s" % (name, ext))
        with open(path + ".tmp", "w") as handle:
            handle.write(text)
        os.replace(path + ".tmp", path)
        paths.append(path)
    picture = _pictures().draw(name, payload, out_dir)
    return paths + ([picture] if picture else [])


def _pictures():
    """benchmarks/pictures.py, found next to this file (tests load this module by path)."""
    spec = importlib.util.spec_from_file_location(
        "bench_pictures", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       "pictures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def publish(out_dir, name, payload, markdown, seconds):
    """Write the results (:func:`write_results`), then print the report and where it
    went: how every benchmark ends. Returns 0, the benchmark's exit code."""
    paths = write_results(os.path.abspath(out_dir), name, payload, markdown)
    print()
    print(markdown)
    print("wrote %s (total %.0f s)" % (", ".join(paths), seconds))
    return 0
