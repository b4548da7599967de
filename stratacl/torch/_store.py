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

Held against a flood and a broken client (any local user can connect to a loopback port):

    accept    never ends while the store is open: EMFILE (or any error of accept) sheds the
              oldest connection still in its handshake, or, with none, takes the next one off
              the queue with a spare descriptor and closes it; then it backs off (1 ms doubling
              to 100 ms) and accepts on
    pending   at most MAX_PENDING connections in their handshake at once: one more closes the
              oldest; each has HANDSHAKE_S to prove the secret
    frames    at most MAX_FRAME bytes; a frame that is longer, empty, cut short, of an unknown
              operation or with fields missing closes that connection only (``dropped``)
    clients   wait for the greeting and the welcome within the timeout they were given
              (torch's ``timeout=``); a connection closed before the welcome (shed by a busy
              server) is made again within that timeout; a refusal is final

Jobs started by torchrun or mpirun keep their launcher's store: this one is used only where
STRATACL_JOB_SECRET says the job is StrataCL's own. Under it torch's TCPStore is never started
and nothing listens on MASTER_PORT (which stays there, free, for a program that does not import
stratacl.torch and gets torch's own store: docs/cluster.md).
"""
from __future__ import annotations

import atexit
import errno
import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import threading
import time
from datetime import timedelta
from urllib.parse import urlparse

import torch.distributed as dist

import stratacl

SECRET_ENV = "STRATACL_JOB_SECRET"
ADDRESS_ENV = "STRATACL_STORE"
MAGIC = b"stratacl-store/1\n"
WELCOME = b"\x01"           # the server's word that the proof was right
REFUSED = b"\x00"           # ... and that it was wrong (a client told this does not try again)
HANDSHAKE_S = 10.0          # an unauthenticated connection is dropped after this long
MAX_PENDING = 64            # connections in their handshake at once; one more sheds the oldest
MAX_FRAME = 64 << 20        # bytes of one request or reply (a key and its value): longer closes the connection
SET, GET, ADD, CAS, CHECK, WAIT, DELETE, NUM_KEYS = range(1, 9)
OK, MISSING, TIMEOUT = 0, 1, 2

_U32 = struct.Struct("!I")
_I64 = struct.Struct("!q")


class BadFrame(ConnectionError):
    """A frame that breaks the protocol: its connection is closed."""


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
    if len(body) > MAX_FRAME:
        raise dist.DistStoreError(f"the job's store: a request of {len(body)} bytes (its key and value) is over "
                                  f"the store's maximum frame of {MAX_FRAME} bytes; keep large data out of the store "
                                  f"(send it with a collective)")
    return _U32.pack(len(body)) + body


def _read_frame(sock: socket.socket) -> tuple[int, list[bytes]]:
    (length,) = _U32.unpack(_recv_exact(sock, 4))
    if not 1 <= length <= MAX_FRAME:
        raise BadFrame(f"a frame of {length} bytes (1 to {MAX_FRAME})")
    body = _recv_exact(sock, length)
    fields, at = [], 1
    while at < len(body):
        if at + 4 > len(body):
            raise BadFrame("a field's length cut short")
        (n,) = _U32.unpack_from(body, at)
        if at + 4 + n > len(body):
            raise BadFrame(f"a field of {n} bytes past the frame's end")
        fields.append(body[at + 4:at + 4 + n])
        at += 4 + n
    return body[0], fields


# each operation's fields: (least, most); None = any number
_FIELDS = {SET: (2, 2), GET: (2, 2), ADD: (2, 2), CAS: (3, 3), CHECK: (0, None), WAIT: (1, None),
           DELETE: (1, 1), NUM_KEYS: (0, 0)}


def _check_request(op: int, fields: list[bytes]) -> None:
    if op not in _FIELDS:
        raise BadFrame(f"unknown operation {op}")
    least, most = _FIELDS[op]
    if len(fields) < least or (most is not None and len(fields) > most):
        raise BadFrame(f"operation {op} with {len(fields)} fields")
    if op in (GET, WAIT, ADD) and len(fields[0 if op != ADD else 1]) != _I64.size:
        raise BadFrame(f"operation {op} with a number of the wrong size")


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
        self.shed = 0                       # connections closed in their handshake to make room
        self.dropped = 0                    # connections past the handshake closed for a bad frame
        self.pending: list[socket.socket] = []   # in their handshake, oldest first (under self.lock)
        self.sock = listening
        self._closed = False
        self._spare: int | None = _open_spare()
        threading.Thread(target=self._accept, daemon=True, name="stratacl-store").start()

    def _accept(self) -> None:
        """Accept until ``close``, whatever accept says: a flood of connections that never
        speak, or the process out of descriptors, slows the store down, never stops it."""
        backoff = 0.0
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError as e:
                if self._closed or e.errno in (errno.EBADF, errno.EINVAL):
                    return
                if not self._shed_oldest():
                    self._shed_next()
                backoff = min(0.1, max(0.001, 2 * backoff))
                time.sleep(backoff)          # the descriptors freed above are closed by their threads
                continue
            backoff = 0.0
            with self.lock:
                self.pending.append(conn)
                over = len(self.pending) > MAX_PENDING
            if over:
                self._shed_oldest()
            try:
                threading.Thread(target=self._serve, args=(conn,), daemon=True, name="stratacl-store-client").start()
            except RuntimeError:            # no thread to be had: this connection goes
                self._forget_pending(conn)
                conn.close()

    def _shed_oldest(self) -> bool:
        """Close the oldest connection still in its handshake (its thread sees its end and lets
        go of the descriptor); False if there is none."""
        with self.lock:
            if not self.pending:
                return False
            conn = self.pending.pop(0)
            self.shed += 1
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return True

    def _shed_next(self) -> None:
        """Out of descriptors with no handshake to shed: give back the spare one, take the next
        connection off the queue and close it, take the spare again."""
        if self._spare is None:
            return
        os.close(self._spare)
        self._spare = None
        try:
            conn, _ = self.sock.accept()
            conn.close()
            self.shed += 1
        except OSError:
            pass
        self._spare = _open_spare()

    def _forget_pending(self, conn: socket.socket) -> bool:
        with self.lock:
            if conn in self.pending:
                self.pending.remove(conn)
                return True
            return False

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                nonce = secrets.token_bytes(32)
                conn.settimeout(HANDSHAKE_S)
                conn.sendall(MAGIC + nonce)
                want, got = _proof(self.secret, nonce), b""
                while len(got) < len(want):
                    more = conn.recv(len(want) - len(got))
                    if not more:
                        raise ConnectionError
                    # refused at the first wrong byte (a client of another protocol, say
                    # torch's TCPStore, is told at once); the nonce is new for every
                    # connection, so what a refusal tells is of no use on the next one
                    if not want.startswith(got + more):
                        raise PermissionError
                    got += more
            except PermissionError:
                self._forget_pending(conn)
                self.refused += 1
                try:
                    conn.sendall(REFUSED)
                    # read what is left of the proof, without waiting: a close with unread bytes
                    # resets the connection, and the client might not read the refusal
                    conn.setblocking(False)
                    while conn.recv(64):
                        pass
                except OSError:
                    pass
                return
            except (OSError, ConnectionError):
                self._forget_pending(conn)
                self.refused += 1
                return
            if not self._forget_pending(conn):
                return                      # shed while it proved itself: its client connects again
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
                    _check_request(op, fields)
                    if op in (GET, WAIT):
                        self._get_or_wait(conn, op, fields)
                    else:
                        with self.lock:
                            conn.sendall(self._update(op, fields))
                            self._answer_waiters()
            except BadFrame:
                self.dropped += 1
                self._forget_waits(conn)
            except (OSError, ConnectionError):
                self._forget_waits(conn)
            except Exception:               # noqa: BLE001 - a request the store cannot do (ADD to a
                self.dropped += 1           # value that is no number): that client goes, the store stays
                self._forget_waits(conn)
            finally:
                with self._open:
                    self.clients -= 1
                    self._open.notify_all()

    def _forget_waits(self, conn: socket.socket) -> None:
        with self.lock:
            self.waiters[:] = [w for w in self.waiters if w[0] is not conn]

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
            value = int(self.data.get(f[0], b"0")) + _I64.unpack(f[1])[0]   # not a number: ValueError
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
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)     # wakes the accept thread
        except OSError:
            pass
        self.sock.close()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None


def _open_spare() -> int | None:
    """A descriptor held in reserve, given back when the process has no other to accept with."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


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
        self._sock = _connect(host, port, secret, timeout.total_seconds())

    def close(self) -> None:
        """Disconnect (without the request lock: a thread may be waiting on a reply)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _call(self, op: int, *fields: bytes, wait: float = 0.0) -> tuple[int, list[bytes]]:
        frame = _pack(op, *fields)
        with self._lock:
            # the store answers at once, or a wait at its own timeout: this is a bound on a
            # store that stopped answering (its process stopped), not a timeout of the request
            self._sock.settimeout(wait + self.timeout.total_seconds())
            try:
                self._sock.sendall(frame)
                return _read_frame(self._sock)
            except TimeoutError:
                raise dist.DistStoreError(f"the job's store did not answer within "
                                          f"{wait + self.timeout.total_seconds():g} s (rank 0's process stopped?)") from None

    def _ms(self, timeout=None) -> bytes:
        s = (self.timeout if timeout is None else timeout).total_seconds()
        return _I64.pack(int(s * 1000))

    def set(self, key, value) -> None:
        self._call(SET, key.encode(), value if isinstance(value, bytes) else str(value).encode())

    def get(self, key) -> bytes:
        status, f = self._call(GET, self._ms(), key.encode(), wait=self.timeout.total_seconds())
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
        s = (self.timeout if timeout is None else timeout).total_seconds()
        if self._call(WAIT, self._ms(timeout), *[k.encode() for k in keys], wait=s)[0] == TIMEOUT:
            raise dist.DistStoreError(f"the job's store: keys {list(keys)} not all set within the timeout")

    def delete_key(self, key) -> bool:
        return self._call(DELETE, key.encode())[0] == OK

    def num_keys(self) -> int:
        return _I64.unpack(self._call(NUM_KEYS)[1][0])[0]


def _connect(host: str, port: int, secret: bytes, timeout: float) -> socket.socket:
    """A connection to the job's store past its handshake, within ``timeout`` seconds (from
    connect to welcome). A connection closed before the welcome (a server shedding a flood
    closes the oldest handshakes) is made again; a wrong secret, or a server of another kind,
    is final."""
    deadline = time.monotonic() + timeout
    tries, last = 0, "no connection made"
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or (tries and left <= 0.01):
            raise dist.DistStoreError(
                f"the job's store at {host}:{port}: no welcome within the timeout of {timeout:g} s ({tries} tries; "
                f"last: {last}); rank 0 serves it from init_process_group on (is it that late, or stopped?); "
                f"raise the timeout given to init_process_group if rank 0 is only slow")
        tries += 1
        try:
            sock = socket.create_connection((host, port), timeout=left)
        except OSError as e:
            if isinstance(e, TimeoutError):
                last = "connect timed out"
                continue
            raise dist.DistStoreError(f"the job's store at {host}:{port}: {e} (the launcher listens there for "
                                      f"the whole job; is this process one of its ranks?)") from e
        magic = None
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            magic = _recv_exact(sock, len(MAGIC))
            if magic != MAGIC:
                raise dist.DistStoreError(f"{host}:{port} is not the job's store (it said {magic!r})")
            nonce = _recv_exact(sock, 32)
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.sendall(_proof(secret, nonce))
            welcome = sock.recv(1)
        except TimeoutError:
            sock.close()
            last = "no greeting" if magic is None else "no welcome"
            continue
        except (OSError, ConnectionError) as e:
            sock.close()
            last = f"closed in the handshake ({type(e).__name__})"
            continue
        except BaseException:
            sock.close()
            raise
        if welcome == WELCOME:
            return sock
        sock.close()
        if welcome == REFUSED:
            raise dist.DistStoreError(f"the job's store at {host}:{port} refused this process: its {SECRET_ENV} "
                                      f"is not the job's (only the launcher's ranks get in)")
        last = "closed before the welcome"


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
