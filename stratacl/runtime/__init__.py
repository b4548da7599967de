"""What runs inside a rank, by concept, one package each; this module is the runtime's API for
the rest of the library.

    services/       the control segment, waits with deadlines, the mailbox, the flight recorder
    memory/         HBM, the shadow address window, the allocators, the registration unit
    pipeline/       the call pipeline every front end's call goes through, and its components
    communicator/   the Communicator and its operators
    hosts/          jobs across hosts, and jobs torchrun or mpirun started
    _world.py       the rank's Runtime, made of all of them: ``init()``, ``finalize()``
    _onesided.py    one-sided access to a communicator's HBM (``SymmetricHeap``), for front ends
    _native.h, *.c  the native layer under all of them, one extension (``_native``): atomics and
                    futex waits on shared words, maps at fixed addresses, the flight recorder,
                    and the communicator's protocol (agreement, the full-mesh and point-to-point
                    calls, the replay of prepared calls)

The packages stand on each other in that order from the bottom (services, memory, pipeline,
communicator, hosts) and on the native layer; ``tests/test_layering.py`` checks it.
"""
from ._native import set_pdeathsig as set_pdeathsig
from ._onesided import COMPARISONS as COMPARISONS
from ._onesided import SIGNAL_OPS as SIGNAL_OPS
from ._onesided import SymmetricHeap as SymmetricHeap
from ._onesided import address_of as address_of
from ._world import NATIVE_CALLS as NATIVE_CALLS
from ._world import finalize as finalize
from ._world import init as init
from ._world import is_initialized as is_initialized
from ._world import runtime as runtime
from .communicator import Communicator as Communicator
from .pipeline import Pipeline as Pipeline
from .pipeline import Work as Work
from .pipeline import pipeline as pipeline

__all__ = [
    "COMPARISONS", "NATIVE_CALLS", "SIGNAL_OPS", "Communicator", "Pipeline", "SymmetricHeap", "Work", "address_of",
    "finalize", "init", "is_initialized", "pipeline", "runtime", "set_pdeathsig",
]
