"""The StrataError tree: one root, one child per subsystem.

Every message names the operation, the rank, what was expected and what was seen, and the fix
when there is one.
"""
from __future__ import annotations


class StrataError(RuntimeError):
    """Root of every error StrataCL-emu raises on purpose."""


class ConfigError(StrataError, ValueError):
    """A setting has an unknown name or a value of the wrong form."""


class BootstrapError(StrataError):
    """A rank could not join its job (missing environment, address window taken, ``spawn``
    called while a rank imports the main module, ...)."""


class NotInitialized(StrataError):
    """This process has no running StrataCL runtime: ``init()`` was not called yet, or
    ``finalize()`` has shut it and its communicators down. Call ``stratacl.init()`` first, and
    issue every operation before ``finalize()``."""


class TooManyCommunicators(StrataError):
    """A rank has no communicator slot left for a new communicator (``split``): each rank has
    a fixed number of slots in the job's control segment (runtime/services/_control.py, COMM_SLOTS),
    and a communicator keeps its slot for the rest of the job. Split once and reuse the
    sub-communicators instead of splitting again per step."""


class RegistrationError(StrataError):
    """An address range is not registered in this rank (never allocated, or already released)."""


class OutOfMemory(StrataError, MemoryError):
    """The rank's HBM cannot hold the requested allocation. Free arrays and retry."""


class CollectiveMismatch(StrataError):
    """Ranks called one collective with disagreeing arguments; raised on every rank of the call.

    ``rejected`` lists the ranks (world numbering) that rejected their own arguments when that is
    the disagreement (they raise their own error; the launcher makes one of them the root cause),
    else it is empty.
    """

    def __init__(self, message: str, rejected: tuple[int, ...] = ()):
        super().__init__(message)
        self.rejected = tuple(rejected)

    def __reduce__(self):
        return (type(self), (self.args[0], self.rejected))


class PeerFailure(StrataError):
    """A peer died or left while this rank waited on it inside an operation.

    ``peer`` is the failed rank (world numbering), ``operation`` the operation that noticed.
    """

    def __init__(self, message: str, peer: int | None = None, operation: str | None = None):
        super().__init__(message)
        self.peer = peer
        self.operation = operation

    def __reduce__(self):
        return (type(self), (self.args[0], self.peer, self.operation))


class CommTimeout(StrataError, TimeoutError):
    """Peers did not arrive within the communication timeout (``STRATACL_TIMEOUT``).

    ``operation`` is the operation that waited, ``missing`` the ranks (world numbering) it was
    still waiting for where it knows them, and ``peer`` the first of them (None if unknown), as
    PeerFailure names its peer.
    """

    def __init__(self, message: str, operation: str | None = None, missing: tuple[int, ...] = ()):
        super().__init__(message)
        self.operation = operation
        self.missing = tuple(missing)
        self.peer = self.missing[0] if self.missing else None

    def __reduce__(self):
        return (type(self), (self.args[0], self.operation, self.missing))


class RankFailure(StrataError):
    """A rank of a job failed; carries the rank, how it ended and its traceback text."""

    def __init__(self, message: str, rank: int | None = None, traceback_text: str = ""):
        super().__init__(message)
        self.rank = rank
        self.traceback_text = traceback_text

    def __reduce__(self):
        return (type(self), (self.args[0], self.rank, self.traceback_text))


class ReplayError(StrataError):
    """Traces that cannot be replayed (``stratacl.ub.replay``): missing ranks, events it does not
    support, members that never reach a call the others made, recordings that do not extrapolate."""


class OneSidedError(StrataError):
    """A one-sided call (``stratacl.shmem``, ``stratacl.torch.symm_mem``) refused before it
    touched any memory: a peer out of the communicator's range, an address outside every
    registered HBM range of the peer, a misaligned or mistyped atomic word, a signal that is
    not a word of a signal pad. ``operation``, ``peer`` (communicator rank) and ``address``
    (the shared virtual address asked for, or None) say which."""

    def __init__(self, message: str, operation: str | None = None, peer: int | None = None,
                 address: int | None = None):
        super().__init__(message)
        self.operation, self.peer, self.address = operation, peer, address

    def __reduce__(self):
        return (type(self), (self.args[0], self.operation, self.peer, self.address))


class SignalTimeout(OneSidedError, TimeoutError):
    """``wait_until`` (or ``wait_signal``) saw no signal satisfying its condition within its
    timeout. ``peer`` is the last rank that updated the word (None: nobody did), ``address``
    the signal word's."""
