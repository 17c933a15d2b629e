"""The ranks' output, forwarded by ``hvdlite-run`` as it comes, unfinished lines included.

Why this exists: Open MPI's ``mpirun`` (PRRTE's I/O forwarding) holds every rank's
output until a newline arrives, so a progress bar that redraws itself with ``\\r``
shows nothing until the rank ends its line -- often at the end of the epoch or of the
job. Open MPI 5 can forward what a rank writes as it arrives (the ``raw`` qualifier of
``--output``), but then two ranks writing at once can cut each other's lines in half
(a rank's output reaches ``mpirun`` in pieces of a few KiB, which need not end at a
newline). So ``hvdlite-run`` asks for raw output *tagged* with the rank it comes from
(``--output tag:raw``) and puts the lines back together itself:

* a rank's complete lines are written whole, never mixed with another rank's;
* a rank's unfinished line is written at once when it redraws itself (it holds a
  carriage return, as a progress bar does) and no other rank has an unfinished line
  on the same terminal; any other unfinished line waits for its newline, as
  ``mpirun`` itself would make it wait;
* when one rank's complete line arrives while another rank's redrawn line is open on
  the terminal, that open line is ended with a newline first, so that the two do not
  run into each other; the bar carries on on the next line.

This module is pure Python and imports nothing else of hvdlite (the launcher must run
without the compiled engine).
"""

from __future__ import annotations

import io
import os
import re
import select
import threading
from collections.abc import Callable
from typing import BinaryIO, TextIO

__all__ = ["TagParser", "LineMux", "forward"]

# PRRTE's tag in front of every piece of a rank's output: "[job,rank]<stream>: ".
_TAG = re.compile(rb"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>: ")
_TAG_TAILS = (b"<stdout>: ", b"<stderr>: ", b"<stddiag>: ")
_MAX_TAG = 64
# How long a piece that may be the start of a tag is held back when nothing follows it.
_HOLD_S = 0.05

Source = tuple[str, str]  # ("job,rank", "") for a rank; ("mpirun", pipe) for mpirun itself


def _could_start_tag(text: bytes) -> bool:
    """True when ``text`` (starting with ``[``) is a proper beginning of a tag."""
    if len(text) > _MAX_TAG:
        return False
    if re.fullmatch(rb"\[\d*", text) or re.fullmatch(rb"\[\d+,\d*", text):
        return True
    head = re.match(rb"\[\d+,\d+\]", text)
    if head is None:
        return False
    rest = text[head.end():]
    return any(tail.startswith(rest) for tail in _TAG_TAILS)


class TagParser:
    """Splits one of ``mpirun``'s output streams into (source, stream, bytes) pieces.

    ``pipe`` ("stdout" or "stderr") names the stream the bytes came from; text before
    the first tag (``mpirun``'s own messages) belongs to ``("mpirun", pipe)`` and is
    written to that stream.  A piece at the end of ``feed``'s input that could be the
    beginning of a tag is held back until more arrives or :meth:`flush` is called.
    """

    def __init__(self, pipe: str) -> None:
        self.pipe = pipe
        self._source: Source = ("mpirun", pipe)
        self._stream = pipe
        self._held = b""

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def feed(self, data: bytes) -> list[tuple[Source, str, bytes]]:
        buf = self._held + data
        self._held = b""
        pieces: list[tuple[Source, str, bytes]] = []
        pos = 0
        for match in _TAG.finditer(buf):
            if match.start() > pos:
                pieces.append((self._source, self._stream, buf[pos:match.start()]))
            job, rank, stream = (g.decode() for g in match.groups())
            self._source = (f"{job},{rank}", "")
            self._stream = "stdout" if stream == "stdout" else "stderr"
            pos = match.end()
        rest = buf[pos:]
        cut = rest.rfind(b"[")
        if cut >= 0 and _could_start_tag(rest[cut:]):
            self._held = rest[cut:]
            rest = rest[:cut]
        if rest:
            pieces.append((self._source, self._stream, rest))
        return pieces

    def flush(self) -> list[tuple[Source, str, bytes]]:
        """Whatever is held back, as the current source's output."""
        held, self._held = self._held, b""
        return [(self._source, self._stream, held)] if held else []


class LineMux:
    """Writes the pieces of several sources to ``stdout``/``stderr`` by the rules in
    this module's docstring.  Thread-safe: both of ``mpirun``'s streams feed one mux.

    ``shared`` says that ``stdout`` and ``stderr`` end on the same screen (or file),
    so that an unfinished line on one of them is in the way of lines on the other.

    ``requests``: ``(prefix, handler)``; a rank's complete line that starts with
    ``prefix`` is a request to the launcher (see :mod:`hvdlite.runner.evict`): it is
    handed to ``handler`` without the prefix, and not written. ``runtime``: receives
    the lines that may be mpirun's messages about its daemons (any line of a piece that
    mentions "daemon" or "Remote"; untagged, mpirun's messages cannot be told from the
    raw output of the rank before them).
    """

    def __init__(self, stdout: BinaryIO | TextIO, stderr: BinaryIO | TextIO,
                 shared: bool, requests: tuple[bytes, Callable[[str], None]] | None = None,
                 runtime: Callable[[str], None] | None = None) -> None:
        self._requests = requests
        self._runtime = runtime
        self._files = {"stdout": stdout, "stderr": stderr}
        self._shared = shared
        self._lock = threading.Lock()
        # Per screen: the source whose unfinished line is on it, and its stream.
        self._open: dict[str, tuple[Source, str] | None] = {"stdout": None, "stderr": None}
        self._pending: dict[tuple[Source, str], bytes] = {}

    def _screen(self, stream: str) -> str:
        return "stdout" if self._shared else stream

    def _write(self, stream: str, data: bytes) -> None:
        f = self._files[stream]
        try:
            if isinstance(f, (io.RawIOBase, io.BufferedIOBase)):
                f.write(data)
                f.flush()
            elif getattr(f, "buffer", None) is not None:
                f.flush()  # whatever the launcher itself printed goes first
                f.buffer.write(data)  # type: ignore[union-attr]
                f.buffer.flush()  # type: ignore[union-attr]
            else:  # a text stream without bytes underneath (a notebook's)
                f.write(data.decode("utf-8", errors="replace"))  # type: ignore[arg-type]
                f.flush()
        except (BrokenPipeError, ValueError):
            pass  # our reader went away (head, a closed notebook): keep draining mpirun

    def write(self, source: Source, stream: str, data: bytes) -> None:
        with self._lock:
            self._write_locked(source, stream, data)

    def _write_locked(self, source: Source, stream: str, data: bytes) -> None:
        screen = self._screen(stream)
        buf = self._pending.pop((source, stream), b"") + data
        newline = buf.rfind(b"\n")
        complete, tail = buf[:newline + 1], buf[newline + 1:]
        if complete and self._requests is not None and source[0] != "mpirun":
            complete = self._take_requests(complete)
        if complete and self._runtime is not None and (b"daemon" in complete or b"Remote" in complete):
            # mpirun's messages after a rank's raw output carry no tag of their own (they
            # count as that rank's), and come on either stream.
            for line in complete.decode("utf-8", errors="replace").splitlines():
                self._runtime(line)
        live = b"\r" in tail  # a line that redraws itself: a progress bar
        open_line = self._open[screen]
        if open_line is not None and open_line[0] != source and (complete or live):
            if complete:
                # Another source's line is open on this screen: end it, then go on.
                self._write(open_line[1], b"\n")
                self._open[screen] = open_line = None
            else:
                live = False  # wait until the other source's line is done
        out = complete + (tail if live else b"")
        if out:
            self._write(stream, out)
        if live:
            self._open[screen] = (source, stream)
        elif complete and open_line is not None and open_line[0] == source:
            self._open[screen] = None
        if tail and not live:
            self._pending[(source, stream)] = tail

    def _take_requests(self, complete: bytes) -> bytes:
        assert self._requests is not None
        prefix, handler = self._requests
        if prefix not in complete:
            return complete
        kept = []
        for line in complete.splitlines(keepends=True):
            if line.startswith(prefix):
                handler(line[len(prefix):].decode("utf-8", errors="replace"))
            else:
                kept.append(line)
        return b"".join(kept)

    def close(self) -> None:
        """Write every unfinished line still held (the job has ended)."""
        with self._lock:
            for (source, stream), tail in list(self._pending.items()):
                del self._pending[(source, stream)]
                screen = self._screen(stream)
                open_line = self._open[screen]
                if open_line is not None and open_line[0] != source:
                    self._write(open_line[1], b"\n")
                self._write(stream, tail)
                self._open[screen] = (source, stream)


def _pump(fd: int, parser: TagParser, mux: LineMux) -> None:
    """Read ``fd`` until end of file, handing its pieces to ``mux``."""
    try:
        while True:
            if parser.holding:
                ready, _, _ = select.select([fd], [], [], _HOLD_S)
                if not ready:
                    for piece in parser.flush():
                        mux.write(*piece)
                    continue
            try:
                data = os.read(fd, 65536)
            except InterruptedError:
                continue
            if not data:
                break
            for piece in parser.feed(data):
                mux.write(*piece)
        for piece in parser.flush():
            mux.write(*piece)
    finally:
        os.close(fd)


def _same_screen(a: BinaryIO | TextIO, b: BinaryIO | TextIO) -> bool:
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (AttributeError, OSError, ValueError):
        return True
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def forward(stdout_fd: int, stderr_fd: int, stdout: BinaryIO | TextIO,
            stderr: BinaryIO | TextIO,
            requests: tuple[bytes, Callable[[str], None]] | None = None,
            runtime: Callable[[str], None] | None = None) -> Callable[[float], None]:
    """Start forwarding ``mpirun``'s tagged raw output from the two pipe ends to
    ``stdout`` and ``stderr``; returns ``finish(timeout)``, which waits for both pipes
    to reach end of file (at most ``timeout`` seconds) and writes what is still held.
    The file descriptors are closed when read to the end. ``requests`` and
    ``runtime``: as :class:`LineMux`'s."""
    mux = LineMux(stdout, stderr, shared=_same_screen(stdout, stderr), requests=requests,
                  runtime=runtime)
    threads = [
        threading.Thread(target=_pump, args=(fd, TagParser(name), mux),
                         name=f"hvdlite-run {name}", daemon=True)
        for fd, name in ((stdout_fd, "stdout"), (stderr_fd, "stderr"))
    ]
    for t in threads:
        t.start()

    def finish(timeout: float) -> None:
        for t in threads:
            t.join(timeout)
        mux.close()

    return finish
