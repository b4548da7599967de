"""StrataCL-emu: an emulated AI supernode on one Linux host, running StrataCL for real.

Inside a rank::

    import numpy as np, stratacl
    comm = stratacl.init()
    x = stratacl.empty((n,), dtype=np.float32)     # lives in this rank's HBM
    comm.all_reduce(x, op="sum")
    stratacl.finalize()

Nothing happens at import: no daemon, no shared memory, no threads until ``init()``.

One call's data path, front end to bytes, is drawn once, in docs/architecture.md.
"""
from . import ep as ep
from . import fabric as fabric
from . import shmem as shmem
from . import ub as ub
from ._arrays import empty as empty
from ._arrays import empty_cache as empty_cache
from ._arrays import empty_like as empty_like
from ._arrays import memory_stats as memory_stats
from ._arrays import memory_summary as memory_summary
from ._arrays import reset_accumulated_memory_stats as reset_accumulated_memory_stats
from ._arrays import reset_peak_memory_stats as reset_peak_memory_stats
from ._arrays import stats as stats
from ._arrays import zeros as zeros
from ._config import Config as Config
from ._config import SETTINGS as SETTINGS
from ._errors import BootstrapError as BootstrapError
from ._errors import CollectiveMismatch as CollectiveMismatch
from ._errors import CommTimeout as CommTimeout
from ._errors import ConfigError as ConfigError
from ._errors import NotInitialized as NotInitialized
from ._errors import OneSidedError as OneSidedError
from ._errors import OutOfMemory as OutOfMemory
from ._errors import PeerFailure as PeerFailure
from ._errors import RankFailure as RankFailure
from ._errors import RegistrationError as RegistrationError
from ._errors import SignalTimeout as SignalTimeout
from ._errors import StrataError as StrataError
from ._errors import TooManyCommunicators as TooManyCommunicators
from ._estimate import Estimate as Estimate
from ._estimate import estimate as estimate
from ._spawn import spawn as spawn
from .runtime import Communicator as Communicator
from .runtime import finalize as finalize
from .runtime import init as init
from .runtime import is_initialized as is_initialized

__version__ = "0.1.0"

__all__ = [
    "BootstrapError", "CollectiveMismatch", "CommTimeout", "Communicator", "Config", "ConfigError",
    "Estimate", "NotInitialized", "OneSidedError", "OutOfMemory", "PeerFailure", "RankFailure", "RegistrationError",
    "SETTINGS", "SignalTimeout", "StrataError", "TooManyCommunicators",
    "config", "empty", "empty_cache", "empty_like", "ep", "estimate", "fabric", "finalize", "init", "is_initialized",
    "memory_stats", "memory_summary", "reset_accumulated_memory_stats", "reset_peak_memory_stats", "shmem",
    "spawn", "stats", "ub", "zeros",
]


def __getattr__(name: str):
    if name == "config":
        # the running rank's settings; before init(), what init() would read from the environment
        from .runtime import is_initialized, runtime
        return runtime().config if is_initialized() else Config()
    raise AttributeError(f"module 'stratacl' has no attribute {name!r}")
