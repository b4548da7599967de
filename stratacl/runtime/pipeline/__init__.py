"""The call pipeline: the one door every front end's call goes through, and the components a
communicator is made of.

    _call       Pipeline: call, input, output, enter, sources_ready, phase/run, finish, tick
                (docs/architecture.md draws a call through it)
    _protocol   SlotProtocol: a call's number, descriptor, barriers and agreement
    _buffers    Buffers: a call's input and output, zero copy or staged
    _execute    Executor: a call's compiled phases run on the cores or the SDMA engine
    _modeling   Modeling: the algorithm choice and the modeled clock's tick
    _plans      timed plans shared by a job's ranks (/dev/shm), made once per call shape
    _work       Work and Worker: asynchronous operations, in call order
    _args       the argument checks the operators share
    _services   RankServices: what these components may use of the rank's runtime
"""
from ._args import aliased as aliased
from ._args import as_flat as as_flat
from ._args import copy_back as copy_back
from ._args import dtype_of as dtype_of
from ._args import expect as expect
from ._args import fixed_address as fixed_address
from ._args import fixed_table as fixed_table
from ._buffers import Buffers as Buffers
from ._buffers import CallInput as CallInput
from ._buffers import EAGER_BYTES as EAGER_BYTES
from ._buffers import EAGER_CHUNKS_READ as EAGER_CHUNKS_READ
from ._buffers import buffer_size as buffer_size
from ._call import Pipeline as Pipeline
from ._call import pipeline as pipeline
from ._execute import Executor as Executor
from ._modeling import Modeling as Modeling
from ._plans import SharedPlans as SharedPlans
from ._protocol import OPS as OPS
from ._protocol import SlotProtocol as SlotProtocol
from ._protocol import descriptor as descriptor
from ._services import RankServices as RankServices
from ._work import Work as Work
from ._work import Worker as Worker
from ._work import agreed as agreed
from ._work import collective as collective
from ._work import on_behalf as on_behalf
from ._work import stand_in as stand_in

__all__ = [
    "EAGER_BYTES", "EAGER_CHUNKS_READ", "OPS", "Buffers", "CallInput", "Executor", "Modeling", "Pipeline",
    "RankServices", "SharedPlans", "SlotProtocol", "Work", "Worker", "agreed", "aliased", "as_flat", "buffer_size",
    "collective", "copy_back", "descriptor", "dtype_of", "expect", "fixed_address", "fixed_table", "on_behalf",
    "pipeline", "stand_in",
]
