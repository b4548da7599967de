"""Reduce operations and the dtypes collectives accept.

Accumulation order (documented, and the same on every rank): the result element is
``((x_0 op x_1) op x_2) ... op x_{N-1}`` in communicator-rank order, computed in the array's
own dtype with numpy's semantics (integers wrap, bool ``sum`` is logical or, bool ``prod``
logical and). ``avg`` is that sum divided by N in the same dtype, for floating dtypes only.
"""
from __future__ import annotations

import numpy as np

from . import _kernels as K

# the codes the kernels know them by (_kernels.h defines them)
DTYPES = {np.dtype(np.bool_): K.T_BOOL, np.dtype(np.uint8): K.T_U8, np.dtype(np.int8): K.T_I8,
          np.dtype(np.int16): K.T_I16, np.dtype(np.int32): K.T_I32, np.dtype(np.int64): K.T_I64,
          np.dtype(np.float16): K.T_F16, np.dtype(np.float32): K.T_F32, np.dtype(np.float64): K.T_F64,
          np.dtype(np.uint16): K.T_U16, np.dtype(np.uint32): K.T_U32, np.dtype(np.uint64): K.T_U64}
DTYPE_BY_CODE = {code: dt for dt, code in DTYPES.items()}

REDUCE_OPS = {"sum": K.OP_SUM, "prod": K.OP_PROD, "min": K.OP_MIN, "max": K.OP_MAX, "avg": K.OP_AVG}
REDUCE_NAMES = {v: k for k, v in REDUCE_OPS.items()}


def dtype_code(dtype: np.dtype, operation: str) -> int:
    code = DTYPES.get(dtype) if isinstance(dtype, np.dtype) else None
    if code is not None:
        return code
    try:
        return DTYPES[np.dtype(dtype)]
    except KeyError:
        names = ", ".join(str(d) for d in DTYPES)
        raise TypeError(f"{operation}: dtype {np.dtype(dtype)} is not supported (supported: {names})") from None


def reduce_code(op: str, dtype: np.dtype, operation: str) -> int:
    code = REDUCE_OPS.get(str(op).lower())
    if code is None:
        raise ValueError(f"{operation}: unknown reduce op {op!r} (expected one of {', '.join(REDUCE_OPS)})")
    if code == K.OP_AVG and np.dtype(dtype).kind != "f":
        raise TypeError(f"{operation}: op 'avg' needs a floating dtype, got {np.dtype(dtype)}")
    return code
