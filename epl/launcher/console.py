"""Worker output -> the launcher's stdout and the workers' log files.

Every worker's stdout+stderr reaches the launcher through a pipe (or, for the
debug worker on a terminal, a pty) and a reader thread per worker. All writes
to the launcher's stdout go through one Console, which is what guarantees that
lines of different workers never interleave mid-line:

* prefixed workers hand it whole lines only (``[worker i] ...\\n``);
* the one pass-through worker (worker 0 under --debug) hands it raw text as it
  arrives, so a pdb prompt without a newline shows at once. While that text
  ends in a partial line, the Console holds other workers' lines and prints
  them right after the pass-through worker's next newline.

Letting worker 0 write to the terminal directly (as an earlier version did)
cannot give this guarantee: the launcher never sees where worker 0's lines end,
and an unbuffered Python print() issues several write() calls per line, so
another worker's line could land between them.
"""
import codecs
import collections
import errno
import fcntl
import os
import pty
import termios
import threading

# How many lines of other workers the Console keeps while the pass-through
# worker has a partial line (e.g. sits at a pdb prompt). Beyond it their reader
# threads wait, so those workers block on a full pipe, as on a paused terminal.
HELD_LINES_LIMIT = 10000
READ_SIZE = 65536


class Console(object):
    """Serialises all worker output onto one text stream, line-atomically.

    Example::

        console = Console(sys.stdout)
        console.write_through("(Pdb) ")          # worker 0's prompt: shown at once
        console.write_line("[worker 1] step 3\\n")  # held: worker 0's line is open
        console.write_through("c\\n")            # prints "c\\n", then the held line
    """

    def __init__(self, out, held_limit=HELD_LINES_LIMIT):
        self.out = out
        self._cond = threading.Condition()
        self._line_open = False
        self._held = collections.deque()
        self._held_limit = held_limit

    def write_line(self, line):
        """Print one complete line (ending in a newline) of a prefixed worker,
        now if the stream is at a line start, otherwise once it is."""
        with self._cond:
            self._cond.wait_for(
                lambda: not self._line_open or len(self._held) < self._held_limit)
            if self._line_open:
                self._held.append(line)
            else:
                self._emit(line)

    def write_through(self, text):
        """Print raw text of the pass-through worker immediately. Held lines go
        out right after its last complete line, before any trailing partial one,
        so a prompt that keeps coming back cannot starve the other workers."""
        if not text:
            return
        with self._cond:
            complete, newline, partial = text.rpartition("\n")
            if newline:
                self._emit(complete + newline)
                self._line_open = False
                self._release_held()
            if partial:
                self._emit(partial)
                self._line_open = True
            self._cond.notify_all()

    def end_through(self):
        """The pass-through worker's output ended: finish its partial line, if
        any, so the next line starts at column 0, and release held lines."""
        with self._cond:
            if self._line_open:
                self._emit("\n")
                self._line_open = False
            self._release_held()
            self._cond.notify_all()

    def _release_held(self):
        while self._held:
            self._emit(self._held.popleft())

    def _emit(self, text):
        """Write and flush, ignoring a broken stdout (`epl-launch ... | head`):
        the readers must keep draining workers' pipes and logs regardless."""
        try:
            self.out.write(text)
            self.out.flush()
        except (OSError, ValueError):
            pass


def pump_lines(stream, index, log, console, tail):
    """Copy a prefixed worker's output line by line: raw to its log, with
    ``[worker i] `` to the console, the last lines into `tail`. Runs in its own
    thread so a chatty worker can never block on a full pipe."""
    prefix = "[worker %d] " % index
    with log, stream:
        for raw in iter(stream.readline, b""):
            log.write(raw)
            log.flush()
            text = raw.decode("utf-8", "replace").rstrip("\n")
            tail.append(text)
            console.write_line(prefix + text + "\n")


def _read_chunks(fd):
    """Yield what `fd` has as soon as it has it. A pty master reports the end
    of its last writer as EIO rather than end-of-file."""
    while True:
        try:
            data = os.read(fd, READ_SIZE)
        except OSError as exc:
            if exc.errno == errno.EIO:
                return
            raise
        if not data:
            return
        yield data


def pump_through(fd, log, console, tail):
    """Copy the pass-through worker's output as it arrives: raw to its log,
    unprefixed to the console (partial lines included, for prompts), complete
    lines into `tail`. Closes `fd` and `log`, and ends the console's partial
    line when the worker's output ends."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    partial = ""
    try:
        with log:
            for data in _read_chunks(fd):
                log.write(data)
                log.flush()
                text = decoder.decode(data)
                console.write_through(text)
                lines = (partial + text).split("\n")
                partial = lines.pop()
                tail.extend(lines)
            console.write_through(decoder.decode(b"", final=True))
    finally:
        os.close(fd)
        if partial:
            tail.append(partial)
        console.end_through()


def _is_terminal(stream):
    try:
        return os.isatty(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def _configure_pty(slave_fd, terminal_fd):
    """Pass bytes through unchanged (no "\\n" -> "\\r\\n": the launcher's own
    terminal does that once) and give the pty the terminal's window size, so
    pdb's readline wraps long lines where the user sees them wrap."""
    attrs = termios.tcgetattr(slave_fd)
    attrs[1] &= ~termios.OPOST
    termios.tcsetattr(slave_fd, termios.TCSANOW, attrs)
    try:
        size = fcntl.ioctl(terminal_fd, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(slave_fd, termios.TIOCSWINSZ, size)
    except OSError:
        pass


def open_through_channel(out):
    """(read_fd, write_fd) for the pass-through worker's stdout and stderr.

    A pty when the launcher's `out` is a terminal, so the worker still sees a
    terminal (isatty is true: pdb keeps readline editing and history, tools
    keep colours) while the launcher sees every byte and knows where lines end;
    a plain pipe otherwise, matching what the worker would see without us."""
    if not _is_terminal(out):
        return os.pipe()
    master, slave = pty.openpty()
    try:
        _configure_pty(slave, out.fileno())
    except OSError:
        os.close(master)
        os.close(slave)
        raise
    return master, slave
