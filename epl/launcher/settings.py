"""Command line of epl-launch -> an immutable, cross-validated Settings.

Pure: no processes, no file system, no environment. Everything that can be
rejected from the command line alone is rejected here, before any port is
picked or any worker started.
"""
import argparse
import collections
import difflib
import re

PROG = "epl-launch"

Settings = collections.namedtuple("Settings", [
    "num_workers", "gpu_per_worker", "machine_list", "machine_rank",
    "log_dir", "task_label", "debug", "script", "script_args", "max_restarts"],
    defaults=(0,))
Settings.__doc__ = """Validated command line. Immutable so planning functions cannot
mutate shared state; machine_list and script_args are tuples."""

# Words `--debug VALUE` accepts (compared lower-cased). Programs written for the
# original EPL pass `--debug True`, because it declared the flag type=bool.
BOOLEAN_WORDS = {"true": True, "1": True, "false": False, "0": False}


def _positive_int(text):
    """argparse type: a positive int, so `--num_workers 0` fails at parse time."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("invalid int value: %r" % text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1, got %r" % text)
    return value


def _non_negative_int(text):
    """argparse type for --machine_rank and --max_restarts (0 is a valid value)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("invalid int value: %r" % text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0, got %r" % text)
    return value


def _boolean(text):
    """argparse type for --debug's value: only the BOOLEAN_WORDS, so a typo is an
    error instead of silently meaning "on" (the original's type=bool did that,
    turning `--debug False` into debug mode)."""
    try:
        return BOOLEAN_WORDS[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            "expected true, false, 1 or 0 (any case), got %r" % text)


def split_host_port(address):
    """Split 'host:port' (or '[v6]:port') and validate it; returns (host, port).

    Done by hand rather than with urllib because TF_CONFIG wants the exact
    string back and we must reject empty hosts and out-of-range ports early,
    before any worker waits forever for a peer that cannot exist."""
    host, sep, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or re.search(r"\s", host):
        raise ValueError("%r is not host:port" % address)
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError("%r: port must be an integer in 1..65535" % address)
    return host, int(port_text)


def _machine_list(text):
    """argparse type: comma-separated host:port list, returned as a tuple."""
    entries = tuple(item.strip() for item in text.split(","))
    for entry in entries:
        try:
            split_host_port(entry)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc))
    return entries


def _task_label(text):
    """argparse type: the label becomes part of a directory name, so keep it to
    characters that cannot create subdirectories or need quoting."""
    if not re.match(r"^[A-Za-z0-9._-]+$", text):
        raise argparse.ArgumentTypeError(
            "%r may only contain letters, digits, '.', '_' and '-'" % text)
    return text


def is_local_host(host):
    """True for loopback names; such workers can all run on this machine."""
    return host in ("localhost", "::1") or host.startswith("127.")


# The launcher's options that take a value, as (flag, argparse keywords). One
# table so the parser and the --debug pre-scan below cannot disagree about
# which tokens are option values.
VALUE_OPTIONS = (
    ("--num_workers", dict(type=_positive_int, required=True,
                           help="number of worker processes in the job (>= 1)")),
    ("--gpu_per_worker", dict(type=_positive_int, required=True,
                              help="devices per worker: GPUs, or virtual CPU devices on a "
                                   "host without GPUs")),
    ("--machine_list", dict(type=_machine_list, default=None,
                            help="ip:port,ip:port,... one entry per worker (default: free "
                                 "ports on 127.0.0.1)")),
    ("--machine_rank", dict(type=_non_negative_int, default=None,
                            help="launch only this worker here (needs --machine_list)")),
    ("--log_dir", dict(default=None,
                       help="the job's log directory: worker_<i>.log go here; worker i's "
                            "task directory is <log_dir>/<i> (shell scripts get it as $1, "
                            "every worker as EPL_TASK_DIR) (default: experiments/...)")),
    ("--task_label", dict(type=_task_label, default=None,
                          help="suffix for the default log directory name")),
    ("--max_restarts", dict(type=_non_negative_int, default=0,
                            help="after a fault (a worker killed by a signal, or a worker "
                                 "that lost its peer: exit codes 130/137/138/143) stop every "
                                 "worker and start them again, up to N times; the job "
                                 "resumes from its newest snapshot (default 0: fail fast; "
                                 "docs/fault_tolerance.md)")),
)
VALUE_FLAGS = frozenset(flag for flag, _ in VALUE_OPTIONS)


def _build_parser():
    """The argparse parser; allow_abbrev=False so `--num 3` is never silently
    taken as --num_workers. --debug only ever sees `--debug=VALUE` because
    parse_args normalises the command line first (see explicit_debug_value)."""
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Start a multi-worker EPL/TensorFlow job, one process per worker.",
        epilog="%s --check-build: report the TensorFlow, op library, collective backends "
               "and devices this Python gives EPL (python -m epl.check_build)" % PROG)
    for flag, keywords in VALUE_OPTIONS:
        parser.add_argument(flag, **keywords)
    parser.add_argument("--debug", nargs="?", const=True, default=False, type=_boolean,
                        metavar="BOOL",
                        help="bare, or with true/false/1/0: worker 0 reads this terminal "
                             "(pdb works) and its output is shown unprefixed; sets "
                             "EPL_DEBUG=1")
    parser.add_argument("script", help=".py runs with this Python, anything else with bash")
    parser.add_argument("script_args", nargs=argparse.REMAINDER,
                        help="passed to the script unchanged")
    return parser


def explicit_debug_value(argv):
    """Rewrite the launcher's own `--debug` tokens to the unambiguous `--debug=VALUE`.

    `--debug True` (the original EPL's spelling) and bare `--debug` must both
    work, and `--debug train.py` must not take the script as the flag's value.
    argparse alone cannot do this (an optional value is taken greedily), so the
    tokens before the script are scanned here: a following boolean word is
    joined to the flag, anything else leaves it bare, meaning true. Scanning
    stops at the script (the first token that is not an option or an option's
    value) or at `--`, so the script's own `--debug False` is never touched.
    A script literally named `0`, `1`, `true` or `false` cannot follow --debug."""
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        if token == "--" or not token.startswith("-") or token == "-":
            return out + list(argv[i:])
        if token == "--debug":
            following = argv[i + 1] if i + 1 < len(argv) else None
            if following is not None and following.lower() in BOOLEAN_WORDS:
                out.append("--debug=" + following)
                i += 2
                continue
            out.append("--debug=true")
        elif token in VALUE_FLAGS:
            out.extend(argv[i:i + 2])
            i += 2
            continue
        else:
            out.append(token)
        i += 1
    return out


def unknown_flag(argv):
    """The first token before the script that starts like a flag but is no launcher flag
    (None if there is none). ``argv`` is normalised (``explicit_debug_value``).

    argparse alone reports such a typo badly: in ``--num_worker 1 --gpu_per_worker 2
    train.py`` it takes ``1`` as the script and everything after it as the script's
    arguments, then says the required flags are missing, never naming ``--num_worker``."""
    known = VALUE_FLAGS | {"--debug", "-h", "--help"}
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "--" or not token.startswith("-") or token == "-":
            return None
        name, equals, _ = token.partition("=")
        if name not in known:
            return name
        index += 2 if name in VALUE_FLAGS and not equals else 1
    return None


def _check_flags(parser, argv):
    """Name an unknown launcher flag (and the flag it was probably meant to be)."""
    name = unknown_flag(argv)
    if name is None:
        return
    flags = sorted(VALUE_FLAGS | {"--debug"})
    close = difflib.get_close_matches(name, flags, n=1)
    parser.error("unrecognized launcher flag %s%s; the launcher's flags are %s, and they go "
                 "before the script (the script's own flags go after it)"
                 % (name, " (did you mean %s?)" % close[0] if close else "", ", ".join(flags)))


def _check_machines(parser, ns):
    """Cross-flag checks of --machine_list / --machine_rank / --num_workers; they
    live at parse time so a bad command fails before anything starts."""
    machines = ns.machine_list
    if machines is not None and len(machines) != ns.num_workers:
        parser.error("argument --machine_list: has %d entries (%s) but --num_workers is %d"
                     % (len(machines), ",".join(machines), ns.num_workers))
    if ns.machine_rank is not None:
        if machines is None:
            parser.error("argument --machine_rank: %d given without --machine_list"
                         % ns.machine_rank)
        if ns.machine_rank >= ns.num_workers:
            parser.error("argument --machine_rank: %d is out of range for --num_workers %d"
                         % (ns.machine_rank, ns.num_workers))
    elif machines is not None:
        remote = [m for m in machines if not is_local_host(split_host_port(m)[0])]
        if remote:
            parser.error("argument --machine_list: %s is not a local address; to run a "
                         "multi-machine job, start one epl-launch per machine with "
                         "--machine_rank" % remote[0])


def parse_args(argv):
    """Parse and cross-validate the command line into a Settings.

    Example: ``parse_args(["--num_workers", "2", "--gpu_per_worker", "1",
    "--debug", "True", "train.py", "--lr", "0.1"])`` gives debug=True,
    script="train.py", script_args=("--lr", "0.1")."""
    parser = _build_parser()
    argv = explicit_debug_value(list(argv))
    _check_flags(parser, argv)
    ns = parser.parse_args(argv)
    _check_machines(parser, ns)
    return Settings(
        num_workers=ns.num_workers, gpu_per_worker=ns.gpu_per_worker,
        machine_list=ns.machine_list, machine_rank=ns.machine_rank, log_dir=ns.log_dir,
        task_label=ns.task_label, debug=ns.debug, script=ns.script,
        script_args=tuple(ns.script_args), max_restarts=ns.max_restarts)
