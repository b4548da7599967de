"""Rank output: every rank's stdout and stderr reach the user as whole lines, tagged or not.

    rank r --stdout pipe--\
    rank r --stderr pipe---+--> one selector thread --> launcher's stdout / stderr
    ...   (2 pipes a rank) /     (per pipe: bytes up to the last newline go out in one write;
                                  the rest waits for its newline, or for EOF)

Each rank writes into pipes of its own, so a line a rank writes in pieces (Python under
``PYTHONUNBUFFERED=1`` writes a print's text and its newline in two writes) cannot be cut by
another rank's bytes, as it could in one shared pipe. One thread waits on all the pipes at once
(epoll), so the cost is one thread and two descriptors a rank, whatever the rank count; as
mpirun and torchrun do, output goes out line by line. Untagged, a read is forwarded as it came,
up to its last newline, with no per-line work; tagged (``--tag-output``), each line gets its
``[rank]: `` prefix.

A partial last line is forwarded, with a newline added, when its pipe reaches EOF (the rank and
whatever it started have exited); a line longer than ``LINE_LIMIT`` bytes is forwarded in pieces.
If the launcher's own output is gone (a closed pipe), rank output is read and dropped, so no rank
blocks on a full pipe.
"""
from __future__ import annotations

import os
import selectors
import threading
import time

# bytes a pipe may hold back waiting for a newline before they are forwarded anyway
LINE_LIMIT = 1 << 16


class _Sink:
    """One of the launcher's output streams, written in bytes when the stream has a binary layer."""

    def __init__(self, stream):
        self.stream = stream
        self.broken = stream is None         # e.g. sys.stdout of a process without one

    def write(self, data: bytes) -> None:
        if self.broken or not data:
            return
        try:
            buffer = getattr(self.stream, "buffer", None)
            if buffer is not None:
                self.stream.flush()          # what the launcher itself printed goes first
                buffer.write(data)
                buffer.flush()
            else:                            # e.g. a notebook's stream: text only
                self.stream.write(data.decode(errors="replace"))
                self.stream.flush()
        except Exception:                    # noqa: BLE001 - closed, broken, or not a stream at all:
            self.broken = True               # drop rank output from now on, but keep draining the pipes


class _Pipe:
    __slots__ = ("fd", "sink", "prefix", "pending")

    def __init__(self, fd: int, sink: _Sink, prefix: bytes):
        self.fd, self.sink, self.prefix, self.pending = fd, sink, prefix, b""

    def take(self, data: bytes) -> bytes:
        """What of ``pending + data`` can go out now: everything up to the last newline."""
        cut = data.rfind(b"\n")
        if cut < 0:
            self.pending += data
            if len(self.pending) < LINE_LIMIT:
                return b""
            data, self.pending = self.pending, b""
            return self._tagged(data + b"\n")
        whole, self.pending = self.pending + data[:cut + 1], data[cut + 1:]
        return self._tagged(whole)

    def rest(self) -> bytes:
        """The partial last line, completed with a newline, at EOF."""
        data, self.pending = self.pending, b""
        return self._tagged(data + b"\n") if data else b""

    def _tagged(self, lines: bytes) -> bytes:
        if not self.prefix:
            return lines
        return b"".join(self.prefix + ln + b"\n" for ln in lines[:-1].split(b"\n"))


class OutputForwarder:
    """Forward ranks' pipes to ``stdout`` / ``stderr`` from one thread.

    ``start``, then ``add`` each rank's read ends as the rank starts (the thread picks them up);
    ``finish`` waits (bounded) for every pipe's EOF, forwards what is left and closes the read
    ends. The forwarder owns the descriptors it is given."""

    def __init__(self, stdout, stderr, tag: bool):
        self._sinks = (_Sink(stdout), _Sink(stderr))
        self._tag = tag
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._deadline: float | None = None
        self._new: list[tuple[int, _Pipe]] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="stratacl-output", daemon=True)

    def add(self, rank: int, stdout_fd: int, stderr_fd: int) -> None:
        prefix = f"[{rank}]: ".encode() if self._tag else b""
        for fd, sink in zip((stdout_fd, stderr_fd), self._sinks):
            os.set_blocking(fd, False)
            with self._lock:
                self._new.append((fd, _Pipe(fd, sink, prefix)))
        os.write(self._wake_w, b"+")

    def start(self) -> None:
        self._thread.start()

    def finish(self, timeout: float) -> None:
        """Forward until every pipe reaches EOF or ``timeout`` s pass (a process a rank left
        behind may hold its pipe open), then flush partial lines and close. Call once."""
        self._deadline = time.monotonic() + timeout
        os.write(self._wake_w, b"x")
        if self._thread.ident is None:        # never started
            self._close_pipes()
        else:
            self._thread.join(timeout + 5)
            if self._thread.is_alive():       # stuck writing to a stalled stdout: leave it be
                return
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    new, self._new = self._new, []
                for fd, pipe in new:
                    self._sel.register(fd, selectors.EVENT_READ, pipe)
                if self._deadline is not None and len(self._sel.get_map()) == 1:
                    break                     # every pipe reached EOF
                wait = None if self._deadline is None else self._deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    break
                for key, _ in self._sel.select(wait):
                    pipe = key.data
                    if pipe is None:
                        os.read(self._wake_r, 4096)
                        continue
                    try:
                        data = os.read(pipe.fd, LINE_LIMIT)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if data:
                        pipe.sink.write(pipe.take(data))
                    else:
                        pipe.sink.write(pipe.rest())
                        self._sel.unregister(pipe.fd)
                        os.close(pipe.fd)
        finally:
            self._close_pipes()

    def _close_pipes(self) -> None:
        with self._lock:
            new, self._new = self._new, []
        for fd, _ in new:
            os.close(fd)
        for key in list(self._sel.get_map().values()):
            if key.data is not None:
                key.data.sink.write(key.data.rest())
                self._sel.unregister(key.fd)
                os.close(key.fd)
