"""The job's key-value store under stratacl-launch: torch's env:// store, on loopback, with the job's secret.

torch's ``init_process_group`` (env://) makes rank 0 serve a TCPStore on MASTER_PORT. That
store binds every interface and lets in whoever connects: any process that reaches the port
can read and write the keys the job's ranks agree through. In a job that ``stratacl-launch``
(or ``stratacl.spawn``) started, ``import stratacl.torch`` puts this store in its place:

    launcher: secret = 32 random bytes, in STRATACL_JOB_SECRET for every rank (never printed);
              a socket listening on 127.0.0.1 (a port the kernel picks), its address in
              STRATACL_STORE, its descriptor handed to the ranks (STRATACL_BOOT's "store")
    rank 0:   StoreServer accepts on that socket, a thread; one thread a client. The socket
              listens from before any rank starts, so a rank connects at once, never retries
    rank r:   JobStore (a torch.distributed.Store) connects, proves it holds the secret:
              server -> MAGIC + nonce (32 bytes); client -> HMAC-SHA256(secret, nonce);
              server -> WELCOME
              a wrong or missing answer within HANDSHAKE_S: the connection is closed, nothing
              of it was read as a request (no key is seen, set or waited on)
    then      requests: u32 length, op byte, fields (u32 length + bytes each); reply: status, fields

Jobs started by torchrun or mpirun keep their launcher's store: this one is used only where
STRATACL_JOB_SECRET says the job is StrataCL's own. Under it torch's TCPStore is never started
and nothing listens on MASTER_PORT (which stays there, free, for a program that does not import
stratacl.torch and gets torch's own store: docs/cluster.md).
"""
from __future__ import annotations

import atexit
import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import threading
from datetime import timedelta
from urllib.parse import urlparse

import torch.distributed as dist

import stratacl

SECRET_ENV = "STRATACL_JOB_SECRET"
ADDRESS_ENV = "STRATACL_STORE"
MAGIC = b"stratacl-store/1\n"
WELCOME = b"\x01"           # the server's word that the proof was right
HANDSHAKE_S = 10.0          # an unauthenticated connection is dropped after this long
SET, GET, ADD, CAS, CHECK, WAIT, DELETE, NUM_KEYS = range(1, 9)
OK, MISSING, TIMEOUT = 0, 1, 2

_U32 = struct.Struct("!I")
_I64 = struct.Struct("!q")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise ConnectionError("the job's store closed the connection")
        buf += got
    return bytes(buf)


def _pack(op: int, *fields: bytes) -> bytes:
    body = bytes([op]) + b"".join(_U32.pack(len(f)) + f for f in fields)
    return _U32.pack(len(body)) + body


def _read_frame(sock: socket.socket) -> tuple[int, list[bytes]]:
    body = _recv_exact(sock, _U32.unpack(_recv_exact(sock, 4))[0])
    fields, at = [], 1
    while at < len(body):
        (n,) = _U32.unpack_from(body, at)
        fields.append(body[at + 4:at + 4 + n])
        at += 4 + n
    return body[0], fields


def _proof(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, nonce, hashlib.sha256).digest()


def job_store() -> tuple[bytes, str, int, int] | None:
    """(secret, host, port, listening descriptor) of this rank's job store, or None outside a
    job that stratacl-launch started."""
    text, address = os.environ.get(SECRET_ENV), os.environ.get(ADDRESS_ENV)
    if not text or not address:
        return None
    host, _, port = address.rpartition(":")
    fd = json.loads(os.environ.get("STRATACL_BOOT", "{}")).get("store", -1)
    return bytes.fromhex(text), host, int(port), fd


class StoreServer:
    """The key-value store's server, run by rank 0 in threads of its own (daemon threads: it
    lives as long as rank 0's process, as torch's TCPStore does)."""

    def __init__(self, listening: socket.socket, secret: bytes):
        self.secret = secret
        self.data: dict[bytes, bytes] = {}
        self.lock = threading.Lock()
        self.clients = 0                    # connections past the handshake, still open
        self._open = threading.Condition()
        self.waiters: list[tuple] = []      # (connection, GET | WAIT, keys, answered) not yet answered
        self.refused = 0                    # connections closed for want of the secret
        self.sock = listening
        threading.Thread(target=self._accept, daemon=True, name="stratacl-store").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="stratacl-store-client").start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                nonce = secrets.token_bytes(32)
                conn.settimeout(HANDSHAKE_S)
                conn.sendall(MAGIC + nonce)
                want, got = _proof(self.secret, nonce), b""
                while len(got) < len(want):
                    more = conn.recv(len(want) - len(got))
                    # refused at the first wrong byte (a client of another protocol, say
                    # torch's TCPStore, is told at once); the nonce is new for every
                    # connection, so what a refusal tells is of no use on the next one
                    if not more or not want.startswith(got + more):
                        raise PermissionError
                    got += more
            except (OSError, ConnectionError, PermissionError):
                self.refused += 1
                return
            conn.settimeout(None)
            try:
                conn.sendall(WELCOME)
            except OSError:
                return
            with self._open:
                self.clients += 1
            try:
                while True:
                    op, fields = _read_frame(conn)
                    if op in (GET, WAIT):
                        self._get_or_wait(conn, op, fields)
                    else:
                        with self.lock:
                            conn.sendall(self._update(op, fields))
                            self._answer_waiters()
            except (OSError, ConnectionError):
                return
            finally:
                with self._open:
                    self.clients -= 1
                    self._open.notify_all()

    def linger(self, timeout: float) -> bool:
        """Serve until every client has disconnected (its rank ended), at most ``timeout``
        seconds: rank 0 calls it as it exits. Its program may end right after its own last
        request is answered, while another rank's last one is still to come (a set that
        completes rank 0's wait, then that rank's own wait). True if every client left."""
        with self._open:
            return self._open.wait_for(lambda: self.clients == 0, timeout)

    def _get_or_wait(self, conn: socket.socket, op: int, f: list[bytes]) -> None:
        """Answer now if every key is there; else leave the request to the set that completes
        it (which answers it at once: rank 0 may exit right after its own last set, and the
        others' answers must be on their way by then), or to its timeout."""
        keys, timeout_ms = f[1:], _I64.unpack(f[0])[0]
        waiter = (conn, op, keys, threading.Event())
        with self.lock:
            if all(k in self.data for k in keys):
                conn.sendall(self._reply(op, keys))
                return
            self.waiters.append(waiter)
        if waiter[3].wait(timeout_ms / 1000):
            return
        with self.lock:
            if waiter in self.waiters:
                self.waiters.remove(waiter)
                conn.sendall(_pack(TIMEOUT))

    def _reply(self, op: int, keys: list[bytes]) -> bytes:
        return _pack(OK, self.data[keys[0]]) if op == GET else _pack(OK)

    def _answer_waiters(self) -> None:
        for w in [w for w in self.waiters if all(k in self.data for k in w[2])]:
            self.waiters.remove(w)
            try:
                w[0].sendall(self._reply(w[1], w[2]))
            except OSError:
                pass
            w[3].set()

    def _update(self, op: int, f: list[bytes]) -> bytes:
        if op == SET:
            self.data[f[0]] = f[1]
            return _pack(OK)
        if op == ADD:
            value = int(self.data.get(f[0], b"0")) + _I64.unpack(f[1])[0]
            self.data[f[0]] = str(value).encode()
            return _pack(OK, _I64.pack(value))
        if op == CAS:
            now = self.data.get(f[0])
            if (now is None and f[1] == b"") or now == f[1]:
                self.data[f[0]] = now = f[2]
            return _pack(OK, now if now is not None else f[1])
        if op == CHECK:
            return _pack(OK if all(k in self.data for k in f) else MISSING)
        if op == DELETE:
            return _pack(OK if self.data.pop(f[0], None) is not None else MISSING)
        if op == NUM_KEYS:
            return _pack(OK, _I64.pack(len(self.data)))
        return _pack(MISSING)

    def close(self) -> None:
        self.sock.close()


def _linger() -> None:
    """At rank 0's exit (after finalize: peers see it finalized while it waits): close this
    process's own clients, then serve the other ranks until they have left, at most the job's
    timeout."""
    for store in _STORES:
        store.close()
    timeout = stratacl.config.timeout
    for server in _SERVERS.values():
        server.linger(timeout)


class JobStore(dist.Store):
    """A client of the job's store, as torch's Store: what ``init_process_group`` gets under
    stratacl-launch. Thread-safe (one request at a time on its connection)."""

    def __init__(self, host: str, port: int, secret: bytes, timeout: timedelta):
        super().__init__()
        self.set_timeout(timeout)          # torch may set another later (Store.set_timeout)
        self._lock = threading.Lock()
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout.total_seconds())
        except OSError as e:
            raise dist.DistStoreError(f"the job's store at {host}:{port}: {e} (the launcher listens there for "
                                      f"the whole job; is this process one of its ranks?)") from e
        self._sock.settimeout(None)
        magic = _recv_exact(self._sock, len(MAGIC))
        if magic != MAGIC:
            raise dist.DistStoreError(f"{host}:{port} is not the job's store (it said {magic!r})")
        self._sock.sendall(_proof(secret, _recv_exact(self._sock, 32)))
        try:
            welcome = _recv_exact(self._sock, len(WELCOME))
        except (OSError, ConnectionError):
            welcome = b""
        if welcome != WELCOME:
            raise dist.DistStoreError(f"the job's store at {host}:{port} refused this process: its {SECRET_ENV} "
                                      f"is not the job's (only the launcher's ranks get in)")

    def close(self) -> None:
        """Disconnect (without the request lock: a thread may be waiting on a reply)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _call(self, op: int, *fields: bytes) -> tuple[int, list[bytes]]:
        with self._lock:
            self._sock.sendall(_pack(op, *fields))
            return _read_frame(self._sock)

    def _ms(self, timeout=None) -> bytes:
        s = (self.timeout if timeout is None else timeout).total_seconds()
        return _I64.pack(int(s * 1000))

    def set(self, key, value) -> None:
        self._call(SET, key.encode(), value if isinstance(value, bytes) else str(value).encode())

    def get(self, key) -> bytes:
        status, f = self._call(GET, self._ms(), key.encode())
        if status == TIMEOUT:
            raise dist.DistStoreError(f"the job's store: key {key!r} not set within {self.timeout.total_seconds():g} s")
        return f[0]

    def add(self, key, amount) -> int:
        return _I64.unpack(self._call(ADD, key.encode(), _I64.pack(int(amount)))[1][0])[0]

    def compare_set(self, key, expected, desired) -> bytes:
        enc = [v if isinstance(v, bytes) else str(v).encode() for v in (expected, desired)]
        return self._call(CAS, key.encode(), *enc)[1][0]

    def check(self, keys) -> bool:
        return self._call(CHECK, *[k.encode() for k in keys])[0] == OK

    def wait(self, keys, timeout=None) -> None:
        if self._call(WAIT, self._ms(timeout), *[k.encode() for k in keys])[0] == TIMEOUT:
            raise dist.DistStoreError(f"the job's store: keys {list(keys)} not all set within the timeout")

    def delete_key(self, key) -> bool:
        return self._call(DELETE, key.encode())[0] == OK

    def num_keys(self) -> int:
        return _I64.unpack(self._call(NUM_KEYS)[1][0])[0]


_SERVERS: dict[int, StoreServer] = {}     # rank 0's server, by listening descriptor
_STORES: list[JobStore] = []              # every client made here, for the process's life


def _env_rendezvous(original):
    """torch's env:// handler, with this store where the job has a secret."""
    def handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs):
        found = job_store()
        if found is None:
            yield from original(url, timeout=timeout, **kwargs)
            return
        secret, host, port, fd = found
        query = dict(p.split("=", 1) for p in filter(None, urlparse(url).query.split("&")))
        rank = int(query.get("rank", os.environ["RANK"]))
        world = int(query.get("world_size", os.environ["WORLD_SIZE"]))
        if rank == 0 and fd >= 0 and fd not in _SERVERS:
            # once a process: a second init_process_group finds the same store, as with torch's
            _SERVERS[fd] = StoreServer(socket.socket(fileno=fd), secret)
            if len(_SERVERS) == 1:
                # registered before init() registers finalize (init_process_group makes the
                # store first), so it runs after it: last-in first-out
                atexit.register(_linger)
        store = JobStore(host, port, secret, timeout)
        # torch holds the store from C++ only: without a Python reference the object behind
        # its methods would be collected and every call through it fail ("Not implemented")
        _STORES.append(store)
        yield store, rank, world
        raise RuntimeError("Unable to perform re-rendezvous using env:// method")
    handler.stratacl = True
    return handler


def install() -> None:
    """Put the job's store behind env:// (once): torch keeps its handlers in a table, and
    offers no way to replace one, so the table's entry is wrapped."""
    import importlib
    table = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    if not getattr(table.get("env"), "stratacl", False):
        table["env"] = _env_rendezvous(table["env"])
