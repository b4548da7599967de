"""Length-prefixed pickle frames between the launcher and a rank (one socket pair per rank)."""
from __future__ import annotations

import pickle
import socket
import struct

_LEN = struct.Struct("!Q")


def send(sock: socket.socket, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LEN.pack(len(data)) + data)


def recv(sock: socket.socket):
    """Blocking read of one frame; None at EOF."""
    head = _read(sock, _LEN.size)
    if head is None:
        return None
    body = _read(sock, _LEN.unpack(head)[0])
    if body is None:
        return None
    return pickle.loads(body)


def _read(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        b = sock.recv(min(n - got, 1 << 20))
        if not b:
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


class FrameReader:
    """Incremental parser for a non-blocking socket: feed bytes, take complete frames."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, data: bytes) -> list:
        self.buf += data
        frames = []
        while len(self.buf) >= _LEN.size:
            n = _LEN.unpack_from(self.buf)[0]
            if len(self.buf) < _LEN.size + n:
                break
            frames.append(bytes(self.buf[_LEN.size:_LEN.size + n]))
            del self.buf[:_LEN.size + n]
        return frames
