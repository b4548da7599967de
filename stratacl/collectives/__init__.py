"""What a call moves, in one rank's terms: slice maps per operator, the backend that compiles and
runs them, the schedules the fabric model times, the partitioner, MoE routing rows.

    slices       (_slices.py) the slice maps per operator: remote slices <peer, src, dst, bytes,
                 op>, a list of phases (``slices.all_gather(me, n, nbytes)``); IN, OUT, SCRATCH
                 name a call's buffers
    Plan, ...    (_backend.py) a phase compiled once per call shape (``compile_plan``), run by
                 the native kernels (_kernels.c: ``run_plan``, ``copy_many``, ``combine``)
    schedules    (_schedule.py) what a call executes step by step, which the fabric model times;
                 the transfer kinds (``schedules.LOAD``, ...) and ``schedules.exchange``
    dtype_code   (_reduce.py) the reduce operations and dtypes collectives accept
    cut, ...     (_partition.py) core partitioning: which core moves which transfer unit
    ep_slices    (_ep.py) expert parallelism's routing rows and what dispatch and combine move
"""
from . import _ep as ep_slices
from . import _schedule as schedules
from . import _slices as slices
from ._backend import Counters as Counters
from ._backend import Plan as Plan
from ._backend import Plans as Plans
from ._backend import addresses as addresses
from ._backend import compile as compile_plan
from ._backend import int64_word as int64_word
from ._kernels import BUFFERS as BUFFERS
from ._kernels import PLAN_COLUMNS as PLAN_COLUMNS
from ._kernels import combine as combine
from ._kernels import copy_many as copy_many
from ._kernels import run_plan as run_plan
from ._partition import Partitioner as Partitioner
from ._partition import cut as cut
from ._partition import default_fan_out_cap as default_fan_out_cap
from ._partition import default_unit_bytes as default_unit_bytes
from ._reduce import DTYPE_BY_CODE as DTYPE_BY_CODE
from ._reduce import REDUCE_NAMES as REDUCE_NAMES
from ._reduce import REDUCE_OPS as REDUCE_OPS
from ._reduce import dtype_code as dtype_code
from ._reduce import reduce_code as reduce_code
from ._slices import IN as IN
from ._slices import OUT as OUT
from ._slices import SCRATCH as SCRATCH

__all__ = [
    "BUFFERS", "DTYPE_BY_CODE", "IN", "OUT", "PLAN_COLUMNS", "REDUCE_NAMES", "REDUCE_OPS", "SCRATCH", "Counters",
    "Partitioner", "Plan", "Plans", "addresses", "combine", "compile_plan", "copy_many", "cut", "default_fan_out_cap",
    "default_unit_bytes", "dtype_code", "ep_slices", "int64_word", "reduce_code", "run_plan", "schedules", "slices",
]
